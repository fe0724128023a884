//! Progress bars (indicatif, on stderr), hidden when asked or when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` units with `message` before it, drawn with `template` (indicatif's template
/// syntax, `{msg}` being `message`); hidden unless `show`.
pub(crate) fn progress_bar(show: bool, len: u64, message: &str, template: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(template)
        .expect("the progress templates are valid")
        .progress_chars("=> ");
    ProgressBar::new(len)
        .with_style(style)
        .with_message(message.to_string())
}
