//! The pages of the file formats, section 5: `ratelimit.toml(5)` (the
//! daemon's config, [`super::ratelimit_toml`]) and `ratelimit-serve.toml(5)`
//! (the service's, [`super::serve_toml`]). Each page is a table of its keys,
//! by the table of the file they go in, rendered here by hand; the tests
//! below hold the tables to the parsers: every key a parser reads is on its
//! page, and every key's example is read and validated by the file's own
//! reader.

use clap_mangen::roff::{Roff, bold, italic, roman};

/// The manual section: file formats.
pub(super) const SECTION: &str = "5";

/// A file format's page.
pub(super) struct Page {
    /// The page's name, and the file's usual one: `ratelimit.toml`.
    pub name: &'static str,
    /// The NAME line, after the dash.
    pub summary: &'static str,
    /// SYNOPSIS: the command lines that read such a file.
    pub synopsis: &'static [&'static str],
    /// DESCRIPTION, a paragraph each.
    pub description: &'static [&'static str],
    /// The tables of the file, a section each.
    pub tables: &'static [Table],
    /// VALUES: the forms of the values, (what, forms) each.
    pub values: &'static [(&'static str, &'static str)],
    /// EXAMPLES.
    pub examples: &'static [Example],
    /// FILES: (path, what) each.
    pub files: &'static [(&'static str, &'static str)],
    /// SEE ALSO.
    pub see_also: &'static [&'static str],
}

/// A table of the file, and its keys.
pub(super) struct Table {
    /// The tables of the parser whose keys these are, as the parser's
    /// `tables()` names them (`""` for the top level): the limit keys are
    /// `[default]`'s and `[[rule]]`'s. For the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub of: &'static [&'static str],
    /// The section's heading.
    pub heading: &'static str,
    /// What the table is, a paragraph each.
    pub text: &'static [&'static str],
    /// Its keys, in the order of the page.
    pub keys: &'static [Key],
}

/// A key of a table.
pub(super) struct Key {
    /// As written in the file.
    pub name: &'static str,
    /// Its type and the forms it takes.
    pub forms: &'static str,
    /// What holds when it is left out (`required` when it may not be).
    pub default: &'static str,
    /// What it does.
    pub text: &'static str,
    /// Lines of its table that hold it with a valid value, and what it needs
    /// beside it (or, beginning with a table's header, lines of the file).
    /// The tests read each in every table it goes in.
    pub example: &'static str,
    /// A table of [`Table::of`] whose reader refuses the key (`[default]`
    /// for `per`), said on the page and checked by the tests.
    pub refused_in: Option<&'static str>,
}

impl Key {
    /// A key with nothing said yet, for `..Key::EMPTY` (the tests check
    /// that every key says what it is).
    pub(super) const EMPTY: Key = Key {
        name: "",
        forms: "",
        default: "",
        text: "",
        example: "",
        refused_in: None,
    };
}

/// An example of the page.
pub(super) struct Example {
    /// What it shows.
    pub what: &'static str,
    /// The text: a file, or command lines.
    pub text: &'static str,
    /// Whether `text` is a file (the tests read it), not command lines.
    #[cfg_attr(not(test), allow(dead_code))]
    pub is_file: bool,
}

impl Page {
    /// The page's file name: `ratelimit.toml.5`.
    pub(super) fn file_name(&self) -> String {
        format!("{}.{SECTION}", self.name)
    }

    /// The roff of the page.
    pub(super) fn render(&self) -> Vec<u8> {
        let mut r = Roff::new();
        let source = format!("ratelimit {}", env!("CARGO_PKG_VERSION"));
        let title = self.name.to_uppercase();
        r.control("TH", [title.as_str(), SECTION, "", &source, "File Formats"]);
        // Keys and commands are not hyphenated, nor lines stretched.
        r.control("nh", []).control("ad", ["l"]);

        r.control("SH", ["NAME"]);
        r.text([roman(format!("{} - {}", self.name, self.summary))]);

        r.control("SH", ["SYNOPSIS"]);
        for (i, line) in self.synopsis.iter().enumerate() {
            if i > 0 {
                r.control("br", []);
            }
            r.text([bold(*line)]);
        }

        r.control("SH", ["DESCRIPTION"]);
        paragraphs(&mut r, self.description);

        for table in self.tables {
            r.control("SH", [table.heading]);
            paragraphs(&mut r, table.text);
            for key in table.keys {
                key.render(&mut r);
            }
        }

        if !self.values.is_empty() {
            r.control("SH", ["VALUES"]);
            for (what, forms) in self.values {
                r.control("TP", [])
                    .text([italic(*what)])
                    .text([roman(*forms)]);
            }
        }

        r.control("SH", ["EXAMPLES"]);
        for (i, example) in self.examples.iter().enumerate() {
            if i > 0 {
                r.control("PP", []);
            }
            r.text([roman(example.what)]);
            block(&mut r, example.text);
        }

        if !self.files.is_empty() {
            r.control("SH", ["FILES"]);
            for (path, what) in self.files {
                r.control("TP", [])
                    .text([italic(*path)])
                    .text([roman(*what)]);
            }
        }

        r.control("SH", ["SEE ALSO"]);
        r.text([roman(self.see_also.join(", "))]);

        let mut out = Vec::new();
        r.to_writer(&mut out).expect("writing into memory");
        out
    }
}

impl Key {
    /// `.TP` with the name, then the forms and default, what it does, and
    /// its example.
    fn render(&self, r: &mut Roff) {
        r.control("TP", []).text([bold(self.name)]);
        let default = if self.default.starts_with("required") {
            format!("; {}.", self.default)
        } else {
            format!("; default: {}.", self.default)
        };
        r.text([italic(self.forms), roman(default)]);
        r.control("br", []);
        let mut text = self.text.to_string();
        if let Some(table) = self.refused_in {
            text.push_str(&format!(" Refused in {table}."));
        }
        r.text([roman(text)]);
        // At the key's indent, after a blank line.
        r.control("IP", []).control("nf", []);
        for line in self.example.lines() {
            r.text([roman(line)]);
        }
        r.control("fi", []);
    }
}

/// Paragraphs, `.PP` between them.
fn paragraphs(r: &mut Roff, text: &[&str]) {
    for (i, p) in text.iter().enumerate() {
        if i > 0 {
            r.control("PP", []);
        }
        r.text([roman(*p)]);
    }
}

/// Lines as they are (a file, commands), indented, after a blank line.
fn block(r: &mut Roff, text: &str) {
    r.control("RS", ["4"]).control("sp", []).control("nf", []);
    for line in text.lines() {
        r.text([roman(line)]);
    }
    r.control("fi", []).control("RE", []);
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        path::{Path, PathBuf},
    };

    use super::{
        super::{ratelimit_toml::PAGE as DAEMON, serve_toml::PAGE as SERVE},
        *,
    };

    /// Where a table's keys are tried: the parser's table, the file around
    /// a key's example (valid without it), and the path to the table the
    /// example's lines go in (a name, or an index into an array of tables).
    struct Place {
        /// The page's table ([`Table::heading`]).
        heading: &'static str,
        /// The parser's table ([`Table::of`], [`Key::refused_in`]).
        of: &'static str,
        /// The file without the example.
        base: &'static str,
        /// The table the example goes in.
        path: &'static [Step],
    }

    enum Step {
        Key(&'static str),
        Index(usize),
    }

    const RULE: &str = "[[rule]]\ncidr = \"198.18.0.0/24\"\n";
    const DEFAULT_LIMIT: &str = "[default]\nrate = \"100/s\"\n";
    const RULE_LIMIT: &str = "[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"100/s\"\n";

    /// Where the daemon's keys are tried.
    const DAEMON_PLACES: &[Place] = &[
        Place {
            heading: "TOP-LEVEL KEYS",
            of: "",
            base: "",
            path: &[],
        },
        Place {
            heading: "RULES: [[rule]]",
            of: "[[rule]]",
            base: RULE_LIMIT,
            path: &[Step::Key("rule"), Step::Index(0)],
        },
        Place {
            heading: "LIMIT KEYS: [default] AND [[rule]]",
            of: "[default]",
            base: "[default]\n",
            path: &[Step::Key("default")],
        },
        Place {
            heading: "LIMIT KEYS: [default] AND [[rule]]",
            of: "[[rule]]",
            base: RULE,
            path: &[Step::Key("rule"), Step::Index(0)],
        },
        Place {
            heading: "KEY LEVELS: levels",
            of: "[default]",
            base: DEFAULT_LIMIT,
            path: &[Step::Key("default")],
        },
        Place {
            heading: "KEY LEVELS: levels",
            of: "[[rule]]",
            base: RULE_LIMIT,
            path: &[Step::Key("rule"), Step::Index(0)],
        },
        Place {
            heading: "LISTS: [[list]]",
            of: "[[list]]",
            base: "[[list]]\nname = \"blocklist\"\naction = \"deny\"\npath = \"blocklist.txt\"\n",
            path: &[Step::Key("list"), Step::Index(0)],
        },
    ];

    const TENANT: &str = "[[tenant]]\nname = \"checkout\"\nanonymous = true\n";
    const DOMAIN: &str = "[[tenant]]\nname = \"checkout\"\nanonymous = true\n\
        [[domain]]\nname = \"checkout\"\ntenants = [\"checkout\"]\n";
    const LIMIT: &str = "[[tenant]]\nname = \"checkout\"\nanonymous = true\n\
        [[domain]]\nname = \"checkout\"\ntenants = [\"checkout\"]\n\
        [[domain.limit]]\ndescriptor = [{ key = \"user\" }]\nrate = \"100/s\"\n";

    /// Where the service's keys are tried.
    const SERVE_PLACES: &[Place] = &[
        Place {
            heading: "TOP-LEVEL KEYS",
            of: "",
            base: TENANT,
            path: &[],
        },
        Place {
            heading: "TENANTS: [[tenant]]",
            of: "[[tenant]]",
            base: TENANT,
            path: &[Step::Key("tenant"), Step::Index(0)],
        },
        Place {
            heading: "DOMAINS: [[domain]]",
            of: "[[domain]]",
            base: DOMAIN,
            path: &[Step::Key("domain"), Step::Index(0)],
        },
        Place {
            heading: "LIMITS: [[domain.limit]]",
            of: "[[domain.limit]]",
            base: LIMIT,
            path: &[
                Step::Key("domain"),
                Step::Index(0),
                Step::Key("limit"),
                Step::Index(0),
            ],
        },
        Place {
            heading: "DESCRIPTOR ENTRIES: descriptor",
            of: "[[domain.limit]]",
            base: LIMIT,
            path: &[
                Step::Key("domain"),
                Step::Index(0),
                Step::Key("limit"),
                Step::Index(0),
            ],
        },
    ];

    /// A directory of its own with the files examples name (a list, a token
    /// file), removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(page: &str) -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rl-{page}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            for (name, text) in [
                ("blocklist.txt", "198.51.100.0/24\n"),
                ("partners.txt", "203.0.113.0/24\n"),
                ("firehol_level1.netset", "192.0.2.0/24\n"),
                ("checkout.token", "checkout-token-0123456789\n"),
            ] {
                std::fs::write(dir.join(name), text).unwrap();
            }
            Dir(dir)
        }

        /// `text` written as a file of the directory, read by `read`: its
        /// errors as text.
        fn read(&self, text: &str, read: fn(&Path) -> Result<(), String>) -> Result<(), String> {
            let path = self.0.join("file.toml");
            std::fs::write(&path, text).unwrap();
            read(&path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn read_daemon(path: &Path) -> Result<(), String> {
        crate::config::check::file(path, &crate::config::RawConfig::default())
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn read_serve(path: &Path) -> Result<(), String> {
        ratelimit_serve::config::read(path)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The keys the page names for the parser's table `of`.
    fn page_keys(page: &Page, of: &str) -> BTreeSet<&'static str> {
        page.tables
            .iter()
            .filter(|t| t.of.contains(&of))
            .flat_map(|t| t.keys.iter().map(|k| k.name))
            .collect()
    }

    /// Every table the parser reads is on the page with exactly its keys.
    fn keys_are_the_parsers(page: &Page, parser: Vec<(&'static str, Vec<&'static str>)>) {
        let mut problems = Vec::new();
        let at = |of: &str| {
            if of.is_empty() {
                "the top level".to_string()
            } else {
                of.to_string()
            }
        };
        for (of, keys) in &parser {
            let parsed: BTreeSet<&str> = keys.iter().copied().collect();
            let paged = page_keys(page, of);
            for key in parsed.difference(&paged) {
                problems.push(format!(
                    "the parser takes `{key}` in {}, which {}(5) does not name: add it to the page's table",
                    at(of),
                    page.name
                ));
            }
            for key in paged.difference(&parsed) {
                problems.push(format!(
                    "{}(5) names `{key}` in {}, which the parser does not take",
                    page.name,
                    at(of)
                ));
            }
        }
        for table in page.tables {
            for of in table.of {
                if !parser.iter().any(|(p, _)| p == of) {
                    problems.push(format!(
                        "{}(5): {:?} is of {of:?}, a table the parser does not have",
                        page.name, table.heading
                    ));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn every_key_the_daemon_reads_is_on_its_page_and_no_other() {
        keys_are_the_parsers(&DAEMON, crate::config::tables());
    }

    #[test]
    fn every_key_the_service_reads_is_on_its_page_and_no_other() {
        keys_are_the_parsers(&SERVE, ratelimit_serve::config::tables());
    }

    /// `base` (a file) with the lines of `example`: those of a table's
    /// header and after it merged into the file, the others into the table
    /// at `path`.
    fn with_example(base: &str, path: &[Step], example: &str) -> String {
        let mut doc: toml::Value = toml::from_str(base).expect("a place's base is TOML");
        let lines: toml::Value = toml::from_str(example)
            .unwrap_or_else(|e| panic!("the example is not TOML: {e}\n{example}"));
        if example.trim_start().starts_with('[') {
            merge(&mut doc, lines);
        } else {
            let mut table = &mut doc;
            for step in path {
                table = match step {
                    Step::Key(k) => table.get_mut(*k),
                    Step::Index(i) => table.get_mut(*i),
                }
                .expect("a place's path is in its base");
            }
            merge(table, lines);
        }
        toml::to_string(&doc).expect("TOML")
    }

    /// `from` into `into`, as TOML adds a table's lines to it: a table's
    /// keys into the same table, an array of tables' into the array's last
    /// table (`[[domain.limit]]` after `[[domain]]`), into its tables one by
    /// one from another array of tables; any other value replaced.
    fn merge(into: &mut toml::Value, from: toml::Value) {
        use toml::Value;
        let tables = |a: &Vec<Value>| !a.is_empty() && a.iter().all(Value::is_table);
        match (into, from) {
            (Value::Table(into), Value::Table(from)) => {
                for (k, v) in from {
                    match into.get_mut(&k) {
                        Some(old) => merge(old, v),
                        None => {
                            into.insert(k, v);
                        }
                    }
                }
            }
            (Value::Array(into), from @ Value::Table(_)) if tables(into) => {
                merge(into.last_mut().expect("not empty"), from);
            }
            (Value::Array(into), Value::Array(from)) if tables(into) && tables(&from) => {
                for (i, v) in from.into_iter().enumerate() {
                    match into.get_mut(i) {
                        Some(old) => merge(old, v),
                        None => into.push(v),
                    }
                }
            }
            (into, from) => *into = from,
        }
    }

    /// Every key's example, in every table the key goes in, is read and
    /// validated by the file's reader (refused where the page says it is).
    fn examples_are_read(page: &Page, places: &[Place], read: fn(&Path) -> Result<(), String>) {
        let dir = Dir::new(page.name);
        let mut problems = Vec::new();
        for table in page.tables {
            let here: Vec<&Place> = places
                .iter()
                .filter(|p| p.heading == table.heading)
                .collect();
            assert!(
                !here.is_empty(),
                "{}(5): no place to try the keys of {:?}: add one to the test",
                page.name,
                table.heading
            );
            for key in table.keys {
                let blank = [
                    ("forms", key.forms),
                    ("default", key.default),
                    ("text", key.text),
                    ("example", key.example),
                ]
                .into_iter()
                .filter(|(_, v)| v.trim().is_empty())
                .map(|(what, _)| what)
                .collect::<Vec<_>>();
                if !blank.is_empty() {
                    problems.push(format!(
                        "{}(5): `{}` in {:?} says no {}",
                        page.name,
                        key.name,
                        table.heading,
                        blank.join(", ")
                    ));
                }
                if !key.example.contains(key.name) {
                    problems.push(format!(
                        "{}(5): the example of `{}` does not hold it",
                        page.name, key.name
                    ));
                }
                for place in &here {
                    let file = with_example(place.base, place.path, key.example);
                    let refused = key.refused_in == Some(place.of);
                    match (dir.read(&file, read), refused) {
                        (Ok(()), false) => {}
                        (Err(e), true) if e.contains(&format!(".{}", key.name)) => {}
                        (Ok(()), true) => problems.push(format!(
                            "{}(5): `{}` is said refused in {}, and this reads:\n{file}",
                            page.name, key.name, place.of
                        )),
                        (Err(e), _) => problems.push(format!(
                            "{}(5): the example of `{}` in {:?} does not read:\n{file}{e}",
                            page.name, key.name, table.heading
                        )),
                    }
                }
            }
        }
        for example in page.examples.iter().filter(|e| e.is_file) {
            if let Err(e) = dir.read(example.text, read) {
                problems.push(format!(
                    "{}(5): the example {:?} does not read:\n{e}",
                    page.name, example.what
                ));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    }

    #[test]
    fn the_daemons_examples_read() {
        examples_are_read(&DAEMON, DAEMON_PLACES, read_daemon);
    }

    #[test]
    fn the_services_examples_read() {
        examples_are_read(&SERVE, SERVE_PLACES, read_serve);
    }

    #[test]
    fn the_pages_render() {
        for (page, th) in [
            (&DAEMON, "\n.TH RATELIMIT.TOML 5 "),
            (&SERVE, "\n.TH RATELIMIT-SERVE.TOML 5 "),
        ] {
            let text = String::from_utf8(page.render()).expect("roff is UTF-8");
            assert!(text.contains(th), "{th} missing from:\n{text}");
            for needle in [
                ".SH NAME",
                ".SH DESCRIPTION",
                ".SH EXAMPLES",
                ".SH \"SEE ALSO\"",
            ] {
                assert!(text.contains(needle), "{needle} missing from:\n{text}");
            }
            for table in page.tables {
                for key in table.keys {
                    let name = format!("\n.B {}\n", key.name.replace('-', "\\-"));
                    let bold = format!("\\fB{}\\fR", key.name.replace('-', "\\-"));
                    assert!(
                        text.contains(&name) || text.contains(&bold),
                        "{}: {} missing",
                        page.name,
                        key.name
                    );
                }
            }
        }
    }
}
