//! The `ember` binary's subcommands that other crates call too: the offline
//! heap check ([`check`]), which the fuzz targets run on mutated heap files,
//! and RDB import/export ([`rdbio`]).

#![forbid(unsafe_code)]

pub mod check;
pub mod rdbio;
mod util;
