//! The `ember` binary's subcommands that other crates call too: the offline
//! heap check ([`check`]), which the fuzz targets run on mutated heap files.

#![forbid(unsafe_code)]

pub mod check;
mod util;
