//! The data of each task the examples run, loaded one way for every binary.

use gym_core::NodeData;
use gym_data::{
    CharCorpus, DataError, MnistDataset, MnistItem, MnistSplit, TokenWindow, TokenWindows,
};
use std::path::Path;

/// MNIST's train and test splits from `data_dir` (default: `$GYM_DATA_DIR/mnist` or the
/// user cache, downloaded if missing), shared by every node.
pub fn mnist(data_dir: Option<&Path>) -> Result<NodeData<MnistItem>, DataError> {
    let dir = gym_data::data_dir(data_dir, "mnist");
    // Decompressing and checking the two splits in parallel halves the start-up.
    let (train, test) = std::thread::scope(|s| {
        let test = s.spawn(|| MnistDataset::load_or_download(&dir, MnistSplit::Test));
        let train = MnistDataset::load_or_download(&dir, MnistSplit::Train);
        (train, test.join().expect("loader thread"))
    });
    Ok(NodeData::shared(train?, test?))
}

/// A character-level text: `text_file`, or `input.txt` in `data_dir` (default:
/// tiny-shakespeare, downloaded if missing).
pub fn text_corpus(
    text_file: Option<&Path>,
    data_dir: Option<&Path>,
) -> Result<CharCorpus, DataError> {
    match text_file {
        Some(file) => CharCorpus::load(file),
        None => CharCorpus::load_or_download(&gym_data::data_dir(data_dir, "shakespeare")),
    }
}

/// Windows of `block_size` characters of `corpus`, the last `val_fraction` held out;
/// `shard` gives each node its own contiguous part of the training text.
pub fn text_windows(
    corpus: &CharCorpus,
    block_size: usize,
    val_fraction: f64,
    shard: bool,
) -> Result<NodeData<TokenWindow>, DataError> {
    let (train, val) = corpus.split(block_size, val_fraction)?;
    Ok(if shard {
        TokenWindows::per_node(train, val)
    } else {
        TokenWindows::shared(train, val)
    })
}
