//! Links that cannot rot: every relative link and `#anchor` of the README, the
//! manual under `docs/`, ARCHITECTURE.md, CONTRIBUTING.md and CHANGELOG.md
//! resolves, and the README stays short.
//!
//! A link is `[text](target)` outside fenced code blocks and code spans;
//! `http://`, `https://` and `mailto:` targets are not followed. A relative
//! target is a path from the linking file's directory (or from the workspace
//! root when it starts with `/`) that must exist, file or directory, Markdown
//! or not. An `#anchor` must name a heading of the target Markdown file, by
//! GitHub's rule (see [`slug`]); headings in code fences do not count.

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Component, Path, PathBuf},
};

/// The README's size at most, in bytes (issue 39).
const README_MAX_BYTES: u64 = 20_000;

/// The workspace root: xtask's manifest directory's parent.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The Markdown files whose links are checked, relative to the root.
fn checked_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "bench/README.md",
        "tests/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        let entries = fs::read_dir(root.join(&dir))
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let path = dir.join(entry.file_name());
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Whether a line opens or closes a fenced code block.
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// GitHub's anchor for a heading's text: lowercase; every character that is
/// not a letter, a digit, a space, a hyphen or an underscore removed
/// (Unicode letters kept); spaces turned into hyphens. A link in the heading
/// counts by its text.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    for (piece, link) in inline_pieces(heading) {
        match link {
            Some(link) => text.push_str(&link.text),
            None => text.push_str(piece),
        }
    }
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings, in order: a heading met again
/// gets `-1`, `-2`, … after its slug.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if is_fence(line) {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let Some(heading) = heading_text(line) else {
            continue;
        };
        let base = slug(heading);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The text of an ATX heading (`# …` to `###### …`, up to three spaces in),
/// without its closing `#`s.
fn heading_text(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let after = &rest[hashes..];
    if !(after.is_empty() || after.starts_with(' ') || after.starts_with('\t')) {
        return None;
    }
    let text = after.trim();
    let closed = text.trim_end_matches('#');
    Some(if closed.is_empty() || closed.ends_with(' ') {
        closed.trim_end()
    } else {
        text
    })
}

/// A Markdown inline link: its text and its target.
struct Link {
    text: String,
    target: String,
}

/// A line cut into pieces, each with the link it is, if it is one. Code
/// spans are never links; a link's text may hold code spans and brackets.
fn inline_pieces(line: &str) -> Vec<(&str, Option<Link>)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'`' => {
                let end = code_span_end(line, i).unwrap_or(i + 1);
                i = end;
            }
            b'\\' => i += 2,
            b'[' => {
                if let Some((end, link)) = link_at(line, i) {
                    if start < i {
                        out.push((&line[start..i], None));
                    }
                    out.push((&line[i..end], Some(link)));
                    start = end;
                    i = end;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    if start < line.len() {
        out.push((&line[start..], None));
    }
    out
}

/// Where the code span opened by the backticks at `at` ends (just past its
/// closing run), if it is closed on this line.
fn code_span_end(line: &str, at: usize) -> Option<usize> {
    let run = line[at..].len() - line[at..].trim_start_matches('`').len();
    let ticks = &line[at..at + run];
    let body = at + run;
    let mut from = body;
    while let Some(found) = line[from..].find(ticks) {
        let close = from + found;
        let close_run = line[close..].len() - line[close..].trim_start_matches('`').len();
        if close_run == run {
            return Some(close + run);
        }
        from = close + close_run;
    }
    None
}

/// The inline link whose `[` is at `at`: where it ends, and the link.
fn link_at(line: &str, at: usize) -> Option<(usize, Link)> {
    let bytes = line.as_bytes();
    let mut depth = 0usize;
    let mut i = at;
    let close = loop {
        match bytes.get(i)? {
            b'`' => {
                i = code_span_end(line, i).unwrap_or(i + 1);
                continue;
            }
            b'\\' => i += 1,
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    break i;
                }
            }
            _ => {}
        }
        i += 1;
    };
    if bytes.get(close + 1) != Some(&b'(') {
        return None;
    }
    let inner_start = close + 2;
    let inner_end = inner_start + line[inner_start..].find(')')?;
    let inner = line[inner_start..inner_end].trim();
    // `<target>` or `target "title"`.
    let target = match inner.strip_prefix('<') {
        Some(rest) => rest.split('>').next().unwrap_or(""),
        None => inner.split_whitespace().next().unwrap_or(""),
    };
    Some((
        inner_end + 1,
        Link {
            text: line[at + 1..close].to_string(),
            target: target.to_string(),
        },
    ))
}

/// Every link of a Markdown text outside code fences: (line number, target).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if is_fence(line) {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (_, link) in inline_pieces(line) {
            if let Some(link) = link {
                out.push((n + 1, link.target));
            }
        }
    }
    out
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every broken link of the checked files, as `file:line: target (why)`.
fn broken_links(root: &Path) -> Vec<String> {
    let files = checked_files(root);
    let mut texts: HashMap<PathBuf, String> = HashMap::new();
    let mut read = |path: &Path| -> Option<String> {
        if let Some(text) = texts.get(path) {
            return Some(text.clone());
        }
        let text = fs::read_to_string(root.join(path)).ok()?;
        texts.insert(path.to_path_buf(), text.clone());
        Some(text)
    };
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file).unwrap_or_else(|| panic!("reading {}", file.display()));
        let dir = file.parent().unwrap_or(Path::new(""));
        for (line, target) in links(&text) {
            let lower = target.to_ascii_lowercase();
            if ["http://", "https://", "mailto:"]
                .iter()
                .any(|scheme| lower.starts_with(scheme))
            {
                continue;
            }
            let mut say = |why: &str| {
                broken.push(format!("{}:{line}: {target} ({why})", file.display()));
            };
            if target.is_empty() {
                say("an empty target");
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else if let Some(from_root) = path.strip_prefix('/') {
                normalize(Path::new(from_root))
            } else {
                normalize(&dir.join(path))
            };
            if resolved.starts_with("..") {
                say("outside the repository");
                continue;
            }
            let on_disk = root.join(&resolved);
            if !on_disk.exists() {
                say(&format!("no such file: {}", resolved.display()));
                continue;
            }
            let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
                continue;
            };
            if on_disk.is_dir() || resolved.extension().is_none_or(|e| e != "md") {
                say("an anchor into a file that is not Markdown");
                continue;
            }
            let Some(target_text) = read(&resolved) else {
                say(&format!("cannot read {}", resolved.display()));
                continue;
            };
            if !anchors(&target_text).contains(anchor) {
                say(&format!(
                    "no heading of {} has this anchor",
                    resolved.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn docs_links_resolve() {
    let broken = broken_links(&root());
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn docs_readme_is_short() {
    let size = fs::metadata(root().join("README.md"))
        .expect("README.md")
        .len();
    assert!(
        size <= README_MAX_BYTES,
        "README.md is {size} bytes, more than {README_MAX_BYTES}: move a section into docs/ \
         and link it"
    );
}

#[test]
fn docs_index_lists_every_page() {
    let root = root();
    let index = fs::read_to_string(root.join("docs/README.md")).expect("docs/README.md");
    let listed: BTreeSet<PathBuf> = links(&index)
        .into_iter()
        .map(|(_, target)| {
            let path = target.split('#').next().unwrap_or("").to_string();
            normalize(&Path::new("docs").join(path))
        })
        .collect();
    let missing: Vec<String> = checked_files(&root)
        .into_iter()
        .filter(|f| f.starts_with("docs") && f != Path::new("docs/README.md"))
        .filter(|f| !listed.contains(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/README.md does not list: {}",
        missing.join(", ")
    );
}

#[test]
fn docs_checker_follows_github() {
    assert_eq!(
        slug("The aggregate's reserve: sources that were there keep their limits"),
        "the-aggregates-reserve-sources-that-were-there-keep-their-limits"
    );
    assert_eq!(
        slug("`ratelimit run --iface IFACE [options]`"),
        "ratelimit-run---iface-iface-options"
    );
    assert_eq!(slug("Über_große Zähler"), "über_große-zähler");
    assert_eq!(slug("See [the guide](docs/x.md)"), "see-the-guide");
    let text = "# A\n\n```sh\n# not a heading\n```\n\n## A\n### A ##\n## B\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(found, ["a", "a-1", "a-2", "b"]);

    let line = "see [`dist/x@.service`](dist/x@.service), `[not](a-link)`, \
                [a [nested] one](b.md#c \"title\") and [ref][r]";
    let targets: Vec<String> = links(line).into_iter().map(|(_, t)| t).collect();
    assert_eq!(targets, ["dist/x@.service", "b.md#c"]);
    let fenced = "```\n[x](nowhere.md)\n```\n[y](y.md)\n";
    assert_eq!(links(fenced), [(4, "y.md".to_string())]);
    assert_eq!(
        normalize(Path::new("docs/guide/../../README.md")),
        Path::new("README.md")
    );
}
