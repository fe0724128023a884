//! Progress of the long loops (feature extraction, regeneration, training): a bar on a terminal
//! (indicatif, on stderr); where stderr is not a terminal (a run under `nohup`, in CI, piped to
//! a log) a plain line at every twentieth of the work instead, so a run of hours still shows
//! where it is; nothing with `--quiet`. Result lines ([`Progress::println`]) are printed in
//! every case.

use std::io::IsTerminal;
#[cfg(test)]
use std::io::Write;
#[cfg(test)]
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// Plain progress lines per run where no bar can be drawn.
const LOG_LINES: u64 = 20;

/// Where plain lines go: stderr, or a buffer (tests).
#[derive(Clone)]
enum Sink {
    Stderr,
    #[cfg(test)]
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    fn line(&self, line: &str) {
        match self {
            Sink::Stderr => eprintln!("{line}"),
            #[cfg(test)]
            Sink::Buffer(buffer) => {
                let mut buffer = buffer
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let _ = writeln!(buffer, "{line}");
            }
        }
    }
}

/// The progress of `len` units of work (sequences, answers, steps): see the module docs.
pub(crate) struct Progress {
    bar: ProgressBar,
    /// Plain lines instead of a bar: one every this many units (0: no lines).
    log_every: u64,
    sink: Sink,
    /// The unit's name in plain lines ("steps").
    unit: &'static str,
    message: String,
    len: u64,
    position: u64,
    /// Position and time at the start of this process's share of the work (a resumed run
    /// starts past 0), for the rate.
    start: (u64, Instant),
}

impl Progress {
    /// A bar of `len` units named `unit`, `message` before it, drawn with `template`
    /// (indicatif's template syntax); plain lines instead where stderr is not a terminal;
    /// nothing unless `show`.
    pub(crate) fn new(
        show: bool,
        len: u64,
        message: &str,
        unit: &'static str,
        template: &str,
    ) -> Self {
        let terminal = std::io::stderr().is_terminal();
        Self::with_sink(show, terminal, len, message, unit, template, Sink::Stderr)
    }

    fn with_sink(
        show: bool,
        terminal: bool,
        len: u64,
        message: &str,
        unit: &'static str,
        template: &str,
        sink: Sink,
    ) -> Self {
        let bar = if show && terminal {
            let style = ProgressStyle::with_template(template)
                .expect("the progress templates are valid")
                .progress_chars("=> ");
            ProgressBar::new(len)
                .with_style(style)
                .with_message(message.to_string())
        } else {
            ProgressBar::hidden()
        };
        Self {
            bar,
            log_every: if show && !terminal {
                len.div_ceil(LOG_LINES).max(1)
            } else {
                0
            },
            sink,
            unit,
            message: message.to_string(),
            len,
            position: 0,
            start: (0, Instant::now()),
        }
    }

    /// Sets the position (work done) without a plain line: where a resumed run starts.
    pub(crate) fn start_at(&mut self, position: u64) {
        self.position = position;
        self.start = (position, Instant::now());
        self.bar.set_position(position);
    }

    /// Moves to `position`; a plain line when it crosses a twentieth of the work.
    pub(crate) fn set_position(&mut self, position: u64) {
        let crossed = self.log_every > 0
            && position / self.log_every > self.position / self.log_every
            && position > self.start.0;
        self.position = position;
        self.bar.set_position(position);
        if crossed {
            let (from, since) = self.start;
            let seconds = since.elapsed().as_secs_f64();
            let rate = (position - from) as f64 / seconds.max(1e-9);
            let left = self.len.saturating_sub(position) as f64 / rate.max(1e-9);
            self.sink.line(&format!(
                "{}: {position}/{} {} ({rate:.2} {} per s, {} elapsed, eta {})",
                self.message,
                self.len,
                self.unit,
                self.unit,
                clock(seconds),
                clock(left)
            ));
        }
    }

    /// One more unit done.
    pub(crate) fn inc(&mut self) {
        self.set_position(self.position + 1);
    }

    /// The text before the bar (and at the start of plain lines).
    pub(crate) fn set_message(&mut self, message: String) {
        self.bar.set_message(message.clone());
        self.message = message;
    }

    /// Prints a result line: above the bar when one is drawn, on stderr otherwise (also with
    /// `--quiet`), so that it reaches a log file.
    pub(crate) fn println(&self, line: &str) {
        if self.bar.is_hidden() {
            self.sink.line(line);
        } else {
            self.bar.println(line);
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `seconds` as `1h02m03s`, `2m03s` or `3s`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, min, sec) => format!("{min}m{sec:02}s"),
        (h, min, sec) => format!("{h}h{min:02}m{sec:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffered(show: bool, terminal: bool, len: u64) -> (Progress, Arc<Mutex<Vec<u8>>>) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let progress = Progress::with_sink(
            show,
            terminal,
            len,
            "training eagle head",
            "steps",
            "{msg} {pos}/{len}",
            Sink::Buffer(buffer.clone()),
        );
        (progress, buffer)
    }

    fn lines(buffer: &Arc<Mutex<Vec<u8>>>) -> Vec<String> {
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn without_a_terminal_progress_is_a_line_at_every_twentieth_and_results_always_print() {
        let (mut progress, buffer) = buffered(true, false, 100);
        progress.start_at(10);
        for _ in 10..100 {
            progress.inc();
        }
        progress.println("step 100: held-out agreement (depth 1 / 2) 50.0 / 45.0 %");
        let got = lines(&buffer);
        // positions 15, 20, ..., 100: the twentieths crossed after the resumed start
        assert_eq!(got.len(), 18 + 1, "{got:?}");
        assert!(
            got[0].starts_with("training eagle head: 15/100 steps ("),
            "{}",
            got[0]
        );
        assert!(got[17].starts_with("training eagle head: 100/100 steps ("));
        assert!(got[17].contains("eta 0s"), "{}", got[17]);
        assert!(got[18].starts_with("step 100: held-out agreement"));

        // --quiet: no progress lines, but results still print
        let (mut quiet, buffer) = buffered(false, false, 100);
        for _ in 0..100 {
            quiet.inc();
        }
        quiet.println("result");
        assert_eq!(lines(&buffer), ["result"]);

        // on a terminal the bar shows progress; nothing goes to the plain lines
        let (mut drawn, buffer) = buffered(true, true, 100);
        for _ in 0..100 {
            drawn.inc();
        }
        assert!(lines(&buffer).is_empty());
    }

    #[test]
    fn clock_reads_as_hours_minutes_seconds() {
        assert_eq!(clock(3.4), "3s");
        assert_eq!(clock(123.0), "2m03s");
        assert_eq!(clock(3723.0), "1h02m03s");
        assert_eq!(clock(-1.0), "0s");
    }
}
