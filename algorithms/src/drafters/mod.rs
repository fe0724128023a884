//! Drafters: what proposes draft tokens. The n-gram / prompt-lookup core lives in [`ngram`].

pub mod ngram;

pub use ngram::{find_matches, ngram_chain, ngram_tree, NgramConfig, NgramMatch, TokenTree};
