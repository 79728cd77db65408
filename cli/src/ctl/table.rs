//! Tables for people, in the style of kubectl: no borders, upper-case
//! headers.

use comfy_table::{Table, presets::NOTHING};

pub fn print(header: &[&str], rows: Vec<Vec<String>>) {
    let mut t = Table::new();
    t.load_preset(NOTHING);
    t.set_header(header.to_vec());
    for r in rows {
        t.add_row(r);
    }
    // comfy-table pads the first column with one space; trim it per line.
    for line in t.to_string().lines() {
        println!("{}", line.strip_prefix(' ').unwrap_or(line).trim_end());
    }
}
