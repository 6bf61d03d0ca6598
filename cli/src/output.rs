//! Printing records: aligned tables for people, JSON for scripts.
//!
//! Commands build a view struct (Serialize) per record and a [`Table`] from the same
//! views, then call [`emit`]; which of the two reaches stdout is the `-o` flag's choice.

use serde::Serialize;

use crate::io::Io;

/// Spaces between two table columns.
const COLUMN_GAP: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns with a header row.
    Table,
    /// One JSON document (an object, or an array for lists).
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    /// For numbers, so their digits line up.
    Right,
}

/// A text table: a header row and data rows, columns padded to their widest cell.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Self {
        Table {
            headers: headers.iter().map(|header| header.to_string()).collect(),
            aligns: vec![Align::Left; N],
            rows: Vec::new(),
        }
    }

    /// Right-aligns column `index` (0-based); out-of-range indexes are ignored.
    pub fn align_right(mut self, index: usize) -> Self {
        if let Some(align) = self.aligns.get_mut(index) {
            *align = Align::Right;
        }
        self
    }

    /// Adds a row; missing cells print empty, extra cells are dropped.
    pub fn push_row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row with a trailing newline, no trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| display_width(h)).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(display_width(cell));
            }
        }
        let mut text = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate() {
                if index > 0 {
                    line.push_str(&" ".repeat(COLUMN_GAP));
                }
                let padding = " ".repeat(widths[index] - display_width(cell));
                match self.aligns[index] {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&padding);
                    }
                    Align::Right => {
                        line.push_str(&padding);
                        line.push_str(cell);
                    }
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

/// Width of a cell in terminal columns. Counting chars is exact for the ASCII ids and
/// names Berth prints and close enough for the rest without a unicode-width dependency.
fn display_width(cell: &str) -> usize {
    cell.chars().count()
}

/// `value` as pretty JSON plus a newline.
pub fn json_text<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// Prints `json` or `table` on stdout, whichever `format` asks for. The table is built
/// lazily: JSON output should not pay for (or fail on) table formatting.
pub async fn emit<T: Serialize + ?Sized>(
    io: &mut Io<'_>,
    format: OutputFormat,
    json: &T,
    table: impl FnOnce() -> Table,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => json_text(json)?,
        OutputFormat::Table => table().render(),
    };
    io.write_stdout(text.as_bytes()).await
}

/// Prints a one-line confirmation of a mutation (table mode) or its JSON record.
pub async fn emit_message<T: Serialize + ?Sized>(
    io: &mut Io<'_>,
    format: OutputFormat,
    json: &T,
    message: &str,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => json_text(json)?,
        OutputFormat::Table => format!("{message}\n"),
    };
    io.write_stdout(text.as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_the_widest_cell() {
        let mut table = Table::new(["KIND", "SIZE", "NAME"]).align_right(1);
        table.push_row(vec!["file".into(), "5".into(), "a.txt".into()]);
        table.push_row(vec!["directory".into(), "4096".into(), "src".into()]);
        assert_eq!(
            table.render(),
            "KIND       SIZE  NAME\n\
             file          5  a.txt\n\
             directory  4096  src\n"
        );
    }

    #[test]
    fn no_trailing_spaces_and_short_rows_are_padded() {
        let mut table = Table::new(["ID", "NOTE"]);
        table.push_row(vec!["a-long-id".into()]);
        table.push_row(vec!["b".into(), "x".into()]);
        assert_eq!(table.render(), "ID         NOTE\na-long-id\nb          x\n");
    }

    #[test]
    fn empty_table_is_just_the_header() {
        assert_eq!(Table::new(["A", "B"]).render(), "A  B\n");
    }

    #[test]
    fn wide_characters_count_as_one_column_each() {
        let mut table = Table::new(["NAME", "X"]);
        table.push_row(vec!["é".into(), "1".into()]);
        assert_eq!(table.render(), "NAME  X\né     1\n");
    }
}
