//! What the README and the book (`docs/book`) promise about the code and files they point to.
//!
//! The book's code is `{{#include}}`d from files that CI compiles and runs, so it cannot drift
//! from them; these tests check that the includes and links name files that exist. CI also
//! builds the book (`mdbook build docs/book`, in `.ci/run`).

use std::path::{Path, PathBuf};

/// The embedding chapter's include of the embedding example, exactly as the chapter has it.
const EMBED_INCLUDE: &str = "{{#include ../../../examples/embed/src/main.rs}}";

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The book's Markdown sources: every `.md` file under `docs/book/src`, in its folders.
fn book_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("docs/book/src"), &mut out);
    out.sort();
    out
}

/// The files named by the `{{#include …}}` and `{{#rustdoc_include …}}` directives of `text`,
/// without an anchor or a line range (`file.rs:anchor`, `file.rs:1:10`).
fn includes(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for directive in ["{{#include ", "{{#rustdoc_include "] {
        for (at, _) in text.match_indices(directive) {
            let rest = &text[at + directive.len()..];
            let end = rest
                .find("}}")
                .expect("an include directive ends with `}}`");
            let target = rest[..end].trim();
            out.push(target.split(':').next().unwrap_or(target));
        }
    }
    out
}

/// The relative targets of the Markdown links and images (`[text](target)`) of `text`, outside
/// fenced code blocks and without their `#fragment`; web links and in-page links are left out.
fn relative_links(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            let Some(end) = rest.find(')') else {
                continue;
            };
            let target = rest[..end].split('#').next().unwrap_or_default();
            if !(target.is_empty() || target.contains("://") || target.starts_with("mailto:")) {
                out.push(target);
            }
        }
    }
    out
}

/// The embedding chapter shows `examples/embed/src/main.rs` by including it, so the code a new
/// user copies is the code CI builds and runs (`.ci/run` runs the example).
#[test]
fn the_embedding_chapter_includes_the_embedding_example() {
    let chapter = root().join("docs/book/src/embedding.md");
    let text = read(&chapter);
    assert!(
        text.lines().any(|line| line.trim() == EMBED_INCLUDE),
        "{} does not include the embedding example as `{EMBED_INCLUDE}`",
        chapter.display()
    );
    let included = chapter
        .parent()
        .expect("the chapter has a folder")
        .join("../../../examples/embed/src/main.rs");
    let example = root().join("examples/embed/src/main.rs");
    assert!(included.is_file(), "{} is not a file", included.display());
    assert_eq!(
        included.canonicalize().expect("the included file resolves"),
        example.canonicalize().expect("the example resolves"),
        "the chapter's include is not examples/embed/src/main.rs"
    );
    assert!(
        read(&example).contains("fn main()"),
        "examples/embed/src/main.rs has no `main`"
    );
}

/// Every file the book includes exists (mdbook only logs a missing one, and still builds).
#[test]
fn every_include_in_the_book_names_a_file() {
    let sources = book_sources();
    assert!(
        sources.len() > 10,
        "docs/book/src holds {} chapters",
        sources.len()
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for source in &sources {
        let text = read(source);
        let folder = source.parent().expect("a chapter has a folder");
        for target in includes(&text) {
            checked += 1;
            if !folder.join(target).is_file() {
                missing.push(format!("{}: {target}", source.display()));
            }
        }
    }
    assert!(checked > 0, "the book includes no file");
    assert!(
        missing.is_empty(),
        "included files that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Every relative link of the README (into the book and the result folders under `docs/`) and
/// of the book's chapters names a file or folder that exists.
#[test]
fn every_relative_link_in_the_readme_and_the_book_names_a_file() {
    let readme = read(&root().join("README.md"));
    let readme_links = relative_links(&readme);
    assert!(
        readme_links
            .iter()
            .any(|target| target.starts_with("docs/book/src/")),
        "the README has no link into the book (docs/book/src)"
    );
    let mut missing = Vec::new();
    for target in readme_links {
        if !root().join(target).exists() {
            missing.push(format!("README.md: {target}"));
        }
    }
    for source in book_sources() {
        let text = read(&source);
        let folder = source.parent().expect("a chapter has a folder");
        for target in relative_links(&text) {
            if !folder.join(target).exists() {
                missing.push(format!("{}: {target}", source.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "links to files that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Every chapter under `docs/book/src` is in the book's table of contents (mdbook builds only
/// what `SUMMARY.md` lists), and the README stays short: the rest belongs in the book.
#[test]
fn every_chapter_is_in_the_summary_and_the_readme_is_short() {
    let src = root().join("docs/book/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed = relative_links(&summary);
    for source in book_sources() {
        let name = source
            .strip_prefix(&src)
            .expect("a chapter is under docs/book/src")
            .to_string_lossy()
            .replace('\\', "/");
        assert!(
            name == "SUMMARY.md" || listed.contains(&name.as_str()),
            "docs/book/src/{name} is not in SUMMARY.md"
        );
    }
    let lines = read(&root().join("README.md")).lines().count();
    assert!(lines <= 200, "README.md has {lines} lines, more than 200");
}
