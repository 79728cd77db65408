//! `ballastctl`: a client of the REST API. Tables for people, `-o json`
//! for scripts. Every error the API returns is printed as it came.

mod client;
mod commands;
mod render;
mod table;

pub use client::{Client, CtlError};
pub use commands::{Cli, run};
