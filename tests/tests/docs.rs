//! What the README promises about code it shows.

use std::path::PathBuf;

fn repo(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The README's embedding section shows `examples/embed/src/main.rs` as it is, so the code
/// a new user copies is the code CI builds and runs.
#[test]
fn the_readme_shows_the_embedding_example_word_for_word() {
    let readme = repo("README.md");
    let main = repo("examples/embed/src/main.rs");
    let section = readme
        .split("## Embedding the crates in your Burn project")
        .nth(1)
        .expect("the README has an embedding section");
    let code = section
        .split("```rust\n")
        .nth(1)
        .and_then(|block| block.split("```\n").next())
        .expect("the section shows a Rust block");
    assert_eq!(
        code, main,
        "the README's embedding code differs from examples/embed"
    );
}
