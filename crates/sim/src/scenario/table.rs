//! A plain-text table with right-aligned numbers, for `--format table`.

/// Rows of cells under a header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are blank, extra cells dropped).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Renders: first column left-aligned, the rest right-aligned.
    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width = vec![0; n];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |row: &Vec<String>| {
            let mut s = String::new();
            for (i, (c, w)) in row.iter().zip(&width).enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = w - c.chars().count();
                if i == 0 {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(&self.header);
        let total: usize = width.iter().sum::<usize>() + 2 * n.saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// A share as a whole percentage.
pub(super) fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// A number with `d` decimals.
pub(super) fn num(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["rule", "p95"]);
        t.row(vec!["random".into(), "324.2".into()]);
        t.row(vec!["rr".into(), "4.3".into()]);
        assert_eq!(
            t.render(),
            "rule      p95\n-------------\nrandom  324.2\nrr        4.3\n"
        );
        assert_eq!(pct(0.456), "46%");
        assert_eq!(num(1.23456, 2), "1.23");
    }
}
