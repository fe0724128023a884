//! Prints a GGUF file's metadata (long values summarised) and tensor table, or the full value
//! of one key: `gguf_dump FILE [KEY]`.
use specdec_models::gguf::{GgufFile, Value};

fn main() -> specdec_models::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: gguf_dump FILE.gguf [KEY]");
    let file = GgufFile::open(&path)?;
    if let Some(key) = args.next() {
        match file.metadata().get(&key) {
            Some(Value::String(s)) => println!("{s}"),
            Some(other) => println!("{other:?}"),
            None => eprintln!("no key {key}"),
        }
        return Ok(());
    }
    println!("{file:?}");
    for (key, value) in file.metadata().entries() {
        println!("{key}: {}", value.describe());
    }
    for t in file.tensors() {
        println!("{} {:?} {}", t.name, t.shape, t.quant_type.name());
    }
    Ok(())
}
