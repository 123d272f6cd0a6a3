//! A minimal CSV reader: one record per line, comma-separated, fields may be
//! double-quoted with `""` as an escaped quote. Newlines inside quotes are not
//! supported (no trace we read has them); such a line is reported malformed.

/// The fields of one line, or `None` when a quote is left open.
pub(crate) fn split_line(line: &str) -> Option<Vec<String>> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (false, '"') if field.is_empty() => quoted = true,
            (true, '"') => {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            }
            (_, c) => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push(field);
    Some(fields)
}

/// Non-empty lines with their 1-based line numbers, the header first.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
}

/// The position of each wanted column in a header row (names compared
/// trimmed and case-insensitively).
pub(crate) fn column(header: &[String], name: &str) -> Option<usize> {
    header.iter().position(|h| {
        h.trim()
            .trim_start_matches('\u{feff}')
            .eq_ignore_ascii_case(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_plain_and_quoted_fields() {
        assert_eq!(split_line("a,b,,c\r").unwrap(), vec!["a", "b", "", "c"]);
        assert_eq!(
            split_line(r#""x, y","say ""hi""",z"#).unwrap(),
            vec!["x, y", r#"say "hi""#, "z"]
        );
        assert_eq!(split_line(r#""open,b"#), None);
        let header = split_line("\u{feff}Timestamp, duration").unwrap();
        assert_eq!(column(&header, "timestamp"), Some(0));
        assert_eq!(column(&header, "duration"), Some(1));
        assert_eq!(column(&header, "cluster"), None);
    }
}
