//! Reading the simulator's CSV inputs (traces, tenants' weights, locality
//! calibrations) with the `csv` crate: RFC 4180, so a quoted field may
//! hold commas, `""` and line breaks; rows may have any number of fields
//! (the callers check what they need); blank lines are skipped.

/// Each record with the line it starts on (1-based), the header first:
/// its fields, or why it could not be read (invalid UTF-8). (The line is
/// counted here from the record's byte offset: the crate's own line count
/// is off after blank lines and CRLF endings.) Hand-written no more: the
/// crate reads what the old line-by-line reader refused (line breaks in
/// quotes); a stray quote now runs to the next one, as RFC 4180 says, and
/// the record it makes is refused by its field count.
pub(crate) fn records(
    text: &str,
) -> impl Iterator<Item = (usize, Result<Vec<String>, String>)> + '_ {
    let reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let (mut counted_to, mut line) = (0usize, 1usize);
    let mut line_at = move |byte: Option<u64>| {
        // The offset may point at the line break before the record (and
        // blank lines after it): the record starts after them.
        let bytes = text.as_bytes();
        let mut byte = (byte.unwrap_or(0) as usize).clamp(counted_to, text.len());
        while bytes.get(byte).is_some_and(|b| *b == b'\r' || *b == b'\n') {
            byte += 1;
        }
        line += bytes[counted_to..byte]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        counted_to = byte;
        line
    };
    reader.into_records().map(move |r| match r {
        Ok(rec) => {
            let line = line_at(rec.position().map(|p| p.byte()));
            (line, Ok(rec.iter().map(String::from).collect()))
        }
        Err(e) => {
            let line = line_at(e.position().map(|p| p.byte()));
            (line, Err(e.to_string()))
        }
    })
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
    fn reads_plain_and_quoted_fields_with_their_lines() {
        let text = "\u{feff}Timestamp, duration\r\na,b,,c\r\n\n\"x, y\",\"say \"\"hi\"\"\",z\n\"two\nlines\",w\n";
        let rows: Vec<(usize, Vec<String>)> = records(text).map(|(l, r)| (l, r.unwrap())).collect();
        assert_eq!(
            rows[1],
            (2, vec!["a".into(), "b".into(), "".into(), "c".into()])
        );
        assert_eq!(
            rows[2],
            (4, vec!["x, y".into(), r#"say "hi""#.into(), "z".into()])
        );
        assert_eq!(rows[3], (5, vec!["two\nlines".into(), "w".into()]));
        assert_eq!(rows.len(), 4, "the blank line is skipped");
        assert_eq!(column(&rows[0].1, "timestamp"), Some(0));
        assert_eq!(column(&rows[0].1, "duration"), Some(1));
        assert_eq!(column(&rows[0].1, "cluster"), None);
    }
}
