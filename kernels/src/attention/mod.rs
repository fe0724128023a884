//! Tree attention over the paged KV cache (placeholder until the CPU kernel lands).
