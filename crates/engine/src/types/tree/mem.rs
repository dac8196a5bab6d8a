use super::{Edit, Pieces};
use crate::Result;
use std::collections::BTreeMap;

#[derive(Default, Clone)]
pub(crate) struct MemPieces(pub BTreeMap<u64, Vec<u8>>);

impl Pieces for MemPieces {
    fn get(&mut self, id: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.0.get(&id).cloned())
    }
    fn put(&mut self, id: u64, bytes: Vec<u8>) -> Result<()> {
        self.0.insert(id, bytes);
        Ok(())
    }
    fn edit(&mut self, id: u64, ordered: bool, e: &Edit) -> Result<()> {
        let mut enc = Vec::new();
        e.encode(ordered, &mut enc);
        let (e2, o2) = Edit::decode(&enc)?;
        assert_eq!((&e2, o2), (e, ordered));
        let old = self.0.get(&id).expect("edit of a missing piece");
        let new = e2.apply(o2, old)?;
        self.0.insert(id, new);
        Ok(())
    }
    fn remove(&mut self, id: u64) -> Result<()> {
        assert!(self.0.remove(&id).is_some(), "removed a missing piece {id}");
        Ok(())
    }
}
