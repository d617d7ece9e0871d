//! Where a key is written in the config text, so that every error can name its line.
//!
//! toml reports parse and type errors with a byte span; [`Document::path_at`] turns that
//! span into the dotted key it belongs to. Errors found after parsing name a dotted key;
//! [`Document::find`] turns that key into its line and the value as written.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Values longer than this are cut in messages.
const MAX_VALUE_CHARS: usize = 60;

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    // Spans always fall on character boundaries, but step back rather than trust it.
    let offset = (0..=offset)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Where a dotted key is in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// The key is written on `line` with this value text.
    Key {
        /// 1-based line of the key.
        line: usize,
        /// The value as written (cut if long).
        value: String,
    },
    /// The key is not written (its default applies); its nearest written ancestor table,
    /// if any, starts on `line`.
    Absent {
        /// 1-based line of the nearest ancestor that is written.
        line: Option<usize>,
    },
}

/// A parsed config text, kept only to find keys in it.
#[derive(Debug)]
pub(crate) struct Document<'t> {
    text: &'t str,
    root: Option<DeTable<'t>>,
}

impl<'t> Document<'t> {
    /// Parses `text`; a text that does not parse yields a document in which no key is found.
    pub(crate) fn parse(text: &'t str) -> Self {
        let root = DeTable::parse(text).ok().map(Spanned::into_inner);
        Document { text, root }
    }

    /// The dotted path of the most deeply nested key whose name or value covers the byte
    /// range `span`, if any.
    pub(crate) fn path_at(&self, span: Range<usize>) -> Option<String> {
        let mut path = Vec::new();
        path_in_table(self.root.as_ref()?, &span, &mut path).then(|| path.join("."))
    }

    /// Where the dotted key `path` (e.g. `averaging.sgp.out_degree`) is written.
    pub(crate) fn find(&self, path: &str) -> Place {
        let Some(root) = &self.root else {
            return Place::Absent { line: None };
        };
        let mut table = root;
        let mut ancestor_line = None;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            let Some((key, value)) = table.get_key_value(part) else {
                break;
            };
            let line = self.line_of(key.span());
            if parts.peek().is_none() {
                return Place::Key {
                    line,
                    value: self.value_text(value.span()),
                };
            }
            ancestor_line = Some(line);
            match value.get_ref() {
                DeValue::Table(inner) => table = inner,
                _ => break,
            }
        }
        Place::Absent {
            line: ancestor_line,
        }
    }

    fn line_of(&self, span: Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    fn value_text(&self, span: Range<usize>) -> String {
        let raw = self.text.get(span).unwrap_or_default().trim();
        let first_line = raw.lines().next().unwrap_or_default();
        if first_line.len() < raw.len() || first_line.chars().count() > MAX_VALUE_CHARS {
            let cut: String = first_line.chars().take(MAX_VALUE_CHARS).collect();
            format!("{cut}…")
        } else {
            raw.to_owned()
        }
    }
}

/// Pushes onto `path` the keys leading to `span` in `table`; false if none covers it.
fn path_in_table(table: &DeTable<'_>, span: &Range<usize>, path: &mut Vec<String>) -> bool {
    for (key, value) in table.iter() {
        path.push(key.get_ref().to_string());
        // Look inside first: a table's span may cover its whole body, and the deepest key
        // is the one to name.
        let inside = match value.get_ref() {
            DeValue::Table(inner) => path_in_table(inner, span, path),
            DeValue::Array(items) => items.iter().any(|item| match item.get_ref() {
                DeValue::Table(inner) => path_in_table(inner, span, path),
                _ => false,
            }),
            _ => false,
        };
        if inside || covers(&key.span(), span) || covers(&value.span(), span) {
            return true;
        }
        path.pop();
    }
    false
}

/// Whether `outer` holds all of `inner` (an empty `inner` at its start counts).
fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end && inner.start < outer.end
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
[swarm]
id = \"demo\"

[averaging]
mode = \"sgp\"

[averaging.sgp]
out_degree = 0
";

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col(TEXT, 0), (1, 1));
        let offset = TEXT.find("out_degree").unwrap();
        assert_eq!(line_col(TEXT, offset), (8, 1));
        assert_eq!(line_col("a = \"é\"\nb", 9), (2, 1));
    }

    #[test]
    fn find_names_the_line_and_value_of_a_nested_key() {
        let doc = Document::parse(TEXT);
        assert_eq!(
            doc.find("averaging.sgp.out_degree"),
            Place::Key {
                line: 8,
                value: "0".to_owned()
            }
        );
        assert_eq!(
            doc.find("swarm.id"),
            Place::Key {
                line: 2,
                value: "\"demo\"".to_owned()
            }
        );
        assert_eq!(
            doc.find("averaging.sgp.staleness"),
            Place::Absent { line: Some(7) }
        );
        assert_eq!(doc.find("checkpoint.keep"), Place::Absent { line: None });
    }

    #[test]
    fn path_at_names_the_deepest_key_covering_an_offset() {
        let doc = Document::parse(TEXT);
        let value = TEXT.rfind('0').unwrap();
        assert_eq!(
            doc.path_at(value..value + 1).as_deref(),
            Some("averaging.sgp.out_degree")
        );
        let key = TEXT.find("mode").unwrap();
        assert_eq!(doc.path_at(key..key + 4).as_deref(), Some("averaging.mode"));
        // A span no key holds whole (here: the whole document) names no key.
        assert_eq!(doc.path_at(0..TEXT.len()), None);
    }
}
