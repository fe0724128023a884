//! A minimal HTTP/1.1 client over tokio's `TcpStream`: one request per connection
//! (`Connection: close`), a body framed by `Transfer-Encoding: chunked`, `Content-Length` or the
//! end of the connection, and a streamed completion's server-sent events read as they arrive,
//! each token chunk timed on arrival.
//!
//! Reads and writes go through `readable` / `try_read` and `writable` / `try_write`, so that no
//! tokio feature beyond `net` is needed.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::TcpStream;

/// Token counts of a completion's final `usage` chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: usize,
    /// `completion_tokens`.
    pub completion_tokens: usize,
    /// `completion_tokens_details.accepted_prediction_tokens`.
    pub accepted: usize,
    /// `completion_tokens_details.rejected_prediction_tokens`.
    pub rejected: usize,
}

/// What one streamed completion gave, with its times in seconds since the request was sent
/// (the connection opened).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Streamed {
    /// The HTTP status (0 when no status line came).
    pub status: u16,
    /// When the first chunk with text arrived.
    pub first_chunk_s: Option<f64>,
    /// When the last chunk with text arrived.
    pub last_chunk_s: Option<f64>,
    /// When the response ended.
    pub end_s: f64,
    /// Chunks that carried text.
    pub text_chunks: usize,
    /// The text, the chunks concatenated.
    pub text: String,
    /// The usage chunk's counts, when one came.
    pub usage: Option<Usage>,
    /// The last chunk's `finish_reason`.
    pub finish_reason: Option<String>,
    /// Whether `data: [DONE]` ended the stream.
    pub done: bool,
    /// Why the request failed: a status other than 200 (with the body's message), an `error`
    /// event, an I/O error, a timeout, or a stream that ended without `[DONE]` or usage.
    pub error: Option<String>,
}

/// Splits a byte stream into server-sent events and returns the `data` of each complete one
/// (its `data:` lines joined by `\n`); other fields and comments are skipped. Lines end in
/// `\n` or `\r\n`; an event ends at a blank line.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds `bytes` and returns the data of the events they complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                }
            }
        }
        events
    }
}

/// Decodes a `Transfer-Encoding: chunked` body fed in pieces of any size.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    pending: Vec<u8>,
    /// Bytes left of the current chunk's data (`None`: a size line comes next).
    left: Option<usize>,
    finished: bool,
}

impl ChunkedDecoder {
    /// Feeds `bytes`; returns the body bytes they complete.
    ///
    /// # Errors
    /// A size line that is not hexadecimal, or chunk data not followed by CRLF.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, String> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while !self.finished {
            match self.left {
                None => {
                    let Some(end) = find(&self.pending, b"\r\n") else {
                        break;
                    };
                    let line = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                    let size = line.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(size, 16)
                        .map_err(|_| format!("a chunk size line `{line}` is not hexadecimal"))?;
                    self.pending.drain(..end + 2);
                    if size == 0 {
                        // trailers are not read: the last chunk ends the body
                        self.finished = true;
                    } else {
                        self.left = Some(size);
                    }
                }
                Some(size) => {
                    if self.pending.len() < size + 2 {
                        break;
                    }
                    if &self.pending[size..size + 2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    out.extend(self.pending.drain(..size));
                    self.pending.drain(..2);
                    self.left = None;
                }
            }
        }
        Ok(out)
    }

    /// Whether the last (zero-size) chunk has been read.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn read_some(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// How a response body is delimited.
enum Framing {
    Chunked(ChunkedDecoder),
    Length(usize),
    Close,
}

/// A response head: status, framing and whatever body bytes came with it.
struct Head {
    status: u16,
    framing: Framing,
    rest: Vec<u8>,
}

async fn send(stream: &TcpStream, method: &str, path: &str, body: &str) -> Result<(), String> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    write_all(stream, request.as_bytes())
        .await
        .map_err(|e| format!("sending the request: {e}"))
}

async fn read_head(stream: &TcpStream) -> Result<Head, String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let end = loop {
        if let Some(end) = find(&raw, b"\r\n\r\n") {
            break end;
        }
        let n = read_some(stream, &mut buf)
            .await
            .map_err(|e| format!("reading the response head: {e}"))?;
        if n == 0 {
            return Err("the server closed the connection before a response".into());
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > 64 * 1024 {
            return Err("a response head over 64 KiB".into());
        }
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("a malformed status line `{status_line}`"))?;
    let mut framing = Framing::Close;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            framing = Framing::Chunked(ChunkedDecoder::default());
        } else if name == "content-length" && !matches!(framing, Framing::Chunked(_)) {
            let length = value
                .parse()
                .map_err(|_| format!("a malformed Content-Length `{value}`"))?;
            framing = Framing::Length(length);
        }
    }
    Ok(Head {
        status,
        framing,
        rest: raw[end + 4..].to_vec(),
    })
}

/// Reads the body after `head`, handing each decoded piece to `on_bytes` as it arrives (it
/// returns `true` to stop reading).
async fn read_body(
    stream: &TcpStream,
    head: Head,
    mut on_bytes: impl FnMut(&[u8]) -> bool,
) -> Result<(), String> {
    let Head {
        mut framing, rest, ..
    } = head;
    let mut seen = 0usize;
    let mut piece = rest;
    let mut buf = [0u8; 8192];
    loop {
        let (bytes, ended) = match &mut framing {
            Framing::Chunked(decoder) => {
                let bytes = decoder.feed(&piece)?;
                (bytes, decoder.finished())
            }
            Framing::Length(length) => {
                let take = piece.len().min(*length - seen);
                seen += take;
                (piece[..take].to_vec(), seen == *length)
            }
            Framing::Close => (piece, false),
        };
        if (!bytes.is_empty() && on_bytes(&bytes)) || ended {
            return Ok(());
        }
        let n = read_some(stream, &mut buf)
            .await
            .map_err(|e| format!("reading the response body: {e}"))?;
        if n == 0 {
            return match framing {
                Framing::Close => Ok(()),
                _ => Err("the server closed the connection mid-body".into()),
            };
        }
        piece = buf[..n].to_vec();
    }
}

/// `GET path`: the status and the body as text, within `timeout`.
///
/// # Errors
/// A connection or protocol error, or the timeout, as a message.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        send(&stream, "GET", path, "").await?;
        let head = read_head(&stream).await?;
        let status = head.status;
        let mut body = Vec::new();
        read_body(&stream, head, |b| {
            body.extend_from_slice(b);
            false
        })
        .await?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("GET {path}: no answer in {} s", timeout.as_secs_f64()))?
}

/// The text of a completion chunk: `choices[0].text` or `choices[0].delta.content`.
fn chunk_text(chunk: &Value) -> Option<&str> {
    let choice = chunk.get("choices")?.get(0)?;
    choice
        .get("text")
        .and_then(Value::as_str)
        .or_else(|| choice.get("delta")?.get("content")?.as_str())
}

fn usage_of(usage: &Value) -> Option<Usage> {
    let count = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as usize);
    let details = usage.get("completion_tokens_details");
    Some(Usage {
        prompt_tokens: count(usage.get("prompt_tokens"))?,
        completion_tokens: count(usage.get("completion_tokens"))?,
        accepted: count(details.and_then(|d| d.get("accepted_prediction_tokens"))).unwrap_or(0),
        rejected: count(details.and_then(|d| d.get("rejected_prediction_tokens"))).unwrap_or(0),
    })
}

impl Streamed {
    /// Takes in one event's data that arrived at `at_s`.
    pub fn take_event(&mut self, data: &str, at_s: f64) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.error
                    .get_or_insert(format!("an event that is not JSON ({e})"));
                return;
            }
        };
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string);
            self.error.get_or_insert(format!("error event: {message}"));
            return;
        }
        if let Some(text) = chunk_text(&chunk).filter(|t| !t.is_empty()) {
            self.first_chunk_s.get_or_insert(at_s);
            self.last_chunk_s = Some(at_s);
            self.text_chunks += 1;
            self.text.push_str(text);
        }
        let finish = chunk
            .get("choices")
            .and_then(|c| c.get(0))
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str);
        if let Some(finish) = finish {
            self.finish_reason = Some(finish.to_string());
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            match usage_of(usage) {
                Some(u) => self.usage = Some(u),
                None => {
                    self.error
                        .get_or_insert(format!("a usage chunk without token counts: {usage}"));
                }
            }
        }
    }

    /// Marks a stream that ended without `[DONE]` or without usage as failed.
    fn check_complete(&mut self) {
        if self.error.is_none() && !self.done {
            self.error = Some("the stream ended without data: [DONE]".into());
        }
        if self.error.is_none() && self.usage.is_none() {
            self.error = Some("the stream had no usage chunk".into());
        }
    }
}

/// POSTs `body` (a request with `"stream": true`) to `path` and reads the server-sent events
/// until `[DONE]`, timing each chunk on arrival; within `timeout` in all. A failure of any kind
/// is in [`Streamed::error`], never an `Err`.
pub async fn stream_completion(
    addr: SocketAddr,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Streamed {
    let sent = Instant::now();
    let mut out = Streamed::default();
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        send(&stream, "POST", path, body).await?;
        let head = read_head(&stream).await?;
        out.status = head.status;
        if head.status != 200 {
            let mut text = Vec::new();
            read_body(&stream, head, |b| {
                text.extend_from_slice(b);
                false
            })
            .await?;
            let text = String::from_utf8_lossy(&text);
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| text.trim().to_string());
            return Err(format!("HTTP {}: {message}", out.status));
        }
        let mut parser = SseParser::default();
        read_body(&stream, head, |bytes| {
            let at_s = sent.elapsed().as_secs_f64();
            for data in parser.feed(bytes) {
                out.take_event(&data, at_s);
            }
            out.done
        })
        .await
    };
    let result = match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!("no complete answer in {} s", timeout.as_secs_f64())),
    };
    out.end_s = sent.elapsed().as_secs_f64();
    match result {
        Ok(()) => out.check_complete(),
        Err(e) => {
            out.error.get_or_insert(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_reads_and_line_endings() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert!(p.feed(b":1}\n").is_empty());
        assert_eq!(p.feed(b"\n"), vec!["{\"a\":1}".to_string()]);
        // CRLF lines, a comment, an event field, two data lines, two events in one read
        let got =
            p.feed(b": keep-alive\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\ndata: [DONE]\n\n");
        assert_eq!(got, vec!["one\ntwo".to_string(), "[DONE]".to_string()]);
        // a blank line without data is no event
        assert!(p.feed(b"\n\n").is_empty());
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for split in 1..body.len() {
            let mut d = ChunkedDecoder::default();
            let mut out = d.feed(&body[..split]).unwrap();
            out.extend(d.feed(&body[split..]).unwrap());
            assert_eq!(out, b"hello, world", "split at {split}");
            assert!(d.finished());
        }
        let mut d = ChunkedDecoder::default();
        assert!(d.feed(b"zz\r\n").unwrap_err().contains("not hexadecimal"));
        let mut d = ChunkedDecoder::default();
        assert!(d.feed(b"2\r\nabXY").unwrap_err().contains("CRLF"));
    }

    #[test]
    fn events_give_text_times_usage_and_errors() {
        let mut s = Streamed::default();
        s.take_event(r#"{"choices":[{"text":"","finish_reason":null}]}"#, 0.1);
        assert_eq!(s.first_chunk_s, None, "an empty chunk is no token");
        s.take_event(r#"{"choices":[{"text":"Hel","finish_reason":null}]}"#, 0.2);
        s.take_event(
            r#"{"choices":[{"delta":{"content":"lo"},"finish_reason":null}]}"#,
            0.5,
        );
        s.take_event(r#"{"choices":[{"text":"","finish_reason":"length"}]}"#, 0.6);
        s.take_event(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,
               "completion_tokens_details":{"accepted_prediction_tokens":2,
               "rejected_prediction_tokens":5}}}"#,
            0.6,
        );
        s.take_event("[DONE]", 0.6);
        s.check_complete();
        assert_eq!(s.error, None);
        assert_eq!((s.first_chunk_s, s.last_chunk_s), (Some(0.2), Some(0.5)));
        assert_eq!((s.text.as_str(), s.text_chunks), ("Hello", 2));
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        assert_eq!(
            s.usage,
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                accepted: 2,
                rejected: 5
            })
        );

        let mut e = Streamed::default();
        e.take_event(r#"{"error":{"message":"boom","type":"server_error"}}"#, 0.1);
        e.take_event("[DONE]", 0.1);
        e.check_complete();
        assert_eq!(e.error.as_deref(), Some("error event: boom"));

        let mut cut = Streamed::default();
        cut.take_event(r#"{"choices":[{"text":"a"}]}"#, 0.1);
        cut.check_complete();
        assert!(cut.error.unwrap().contains("[DONE]"));
    }
}
