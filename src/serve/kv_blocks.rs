//! The block pool of the paged KV cache (issue 26): which pool blocks each sequence holds, in
//! order (its block table, the device data `Op::PagedAttention` reads), and which slots its
//! next tokens' K/V rows go to (`Op::PagedCacheWrite`'s slots). Plain Rust, no device: the
//! scheduler owns one and sends the tables and slots it gives to the device each step.
//!
//! - A free list and a reference count per block; a block is free exactly when no table holds
//!   it.
//! - Prefix sharing by content: a full block is registered under a hash of its token ids and
//!   of every token before it (a chain hash, the tokens kept to rule out collisions), and a new
//!   sequence whose prompt starts with the same full blocks takes them by reference instead of
//!   computing them again ([`BlockPool::start`]). The block holding the prompt's last token is
//!   never taken from the cache: that token's logits are needed, so it is always computed.
//! - [`BlockPool::fork`] shares all of a sequence's blocks, the partial last one too; the first
//!   append to a shared partial block copies it first (copy-on-write: the append returns the
//!   copy to perform before its rows are written). Full blocks are never written again, so
//!   they are shared without copies.
//! - Running out of blocks is [`KvBlockError::OutOfBlocks`], the value the scheduler preempts
//!   on; the failed call changes nothing.
//! - A prompt prefilled in chunks takes all its blocks at once ([`BlockPool::reserve`]) but
//!   computes their rows over several steps: a block is registered for sharing only once
//!   [`BlockPool::written`] says its rows are in it, so no other sequence reads rows that are
//!   not there yet.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use thiserror::Error;

/// A sequence's id, the scheduler's.
pub type SeqId = u64;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KvBlockError {
    /// Not enough free blocks for the request: `needed` more, `free` left. Nothing changed.
    #[error("the KV cache is out of blocks: {needed} needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("sequence {0} has no blocks in the pool")]
    UnknownSequence(SeqId),
    #[error("sequence {0} already holds blocks")]
    SequenceExists(SeqId),
    #[error("a pool needs at least one block of at least one token")]
    Empty,
    #[error(
        "sequence {0} has rows not written yet (a prefill in progress): nothing can be appended"
    )]
    Unwritten(SeqId),
    #[error("sequence {seq} holds {len} tokens: its first {upto} rows cannot be written")]
    PastEnd { seq: SeqId, upto: usize, len: usize },
}

/// A copy of the first `rows` rows of block `from` into block `to` (every layer, head and of
/// K and V), to perform before the rows of the append that asked for it are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub from: u32,
    pub to: u32,
    pub rows: usize,
}

/// What an append gives: one slot (`block·block_size + offset`) per appended token, and the
/// copy-on-write to perform first, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Appended {
    pub slots: Vec<i32>,
    pub copy: Option<BlockCopy>,
}

#[derive(Debug, Clone, Default)]
struct Sequence {
    blocks: Vec<u32>,
    tokens: Vec<u32>,
    /// The chain hash of each full block whose rows are written, in order.
    hashes: Vec<u64>,
    /// Leading tokens whose K/V rows are in the blocks (all of them, but during a
    /// [`BlockPool::reserve`]d prefill).
    written: usize,
}

/// A registered full block: its hash chain's parent and its tokens (checked on a match).
#[derive(Debug, Clone)]
struct Cached {
    block: u32,
    parent: u64,
    tokens: Vec<u32>,
}

/// The pool: `num_blocks` blocks of `block_size` token rows.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// Free blocks, taken from the end.
    free: Vec<u32>,
    seqs: HashMap<SeqId, Sequence>,
    cached: HashMap<u64, Cached>,
    /// The hash each registered block is cached under.
    hash_of: Vec<Option<u64>>,
}

/// The hash of the chain before the first block.
const ROOT: u64 = 0x9e37_79b9_7f4a_7c15;

fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Result<BlockPool, KvBlockError> {
        // Slots are i32 on the device.
        let fits = num_blocks
            .checked_mul(block_size)
            .is_some_and(|n| n <= i32::MAX as usize);
        if num_blocks == 0 || block_size == 0 || !fits || num_blocks > u32::MAX as usize {
            return Err(KvBlockError::Empty);
        }
        Ok(BlockPool {
            block_size,
            refs: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            cached: HashMap::new(),
            hash_of: vec![None; num_blocks],
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Sequence `seq`'s block table, in order.
    pub fn table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// Sequence `seq`'s tokens (its length is their number).
    pub fn tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.tokens.as_slice())
    }

    /// How many tables hold `block`.
    pub fn refcount(&self, block: u32) -> u32 {
        self.refs[block as usize]
    }

    /// Starts sequence `seq` on `prompt`: its leading full blocks that the pool already holds
    /// (same tokens, same prefix) are shared, and the rest appended. Returns how many leading
    /// tokens are cached (their K/V need no computing) and the append of the others, whose
    /// rows the caller writes at once. Out of blocks leaves nothing behind.
    pub fn start(&mut self, seq: SeqId, prompt: &[u32]) -> Result<(usize, Appended), KvBlockError> {
        self.start_with(seq, prompt, true)
    }

    /// As [`BlockPool::start`], for a prompt whose rows past the cached prefix are written
    /// later, chunk by chunk: its blocks are taken now (so the prefill cannot run out half way)
    /// but shared with other sequences only as [`BlockPool::written`] reports their rows in.
    pub fn reserve(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
    ) -> Result<(usize, Appended), KvBlockError> {
        self.start_with(seq, prompt, false)
    }

    fn start_with(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        written: bool,
    ) -> Result<(usize, Appended), KvBlockError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvBlockError::SequenceExists(seq));
        }
        let bs = self.block_size;
        // Never the block with the last token: its logits are computed, so its row is written.
        let shareable = prompt.len().saturating_sub(1) / bs;
        let mut s = Sequence::default();
        let mut parent = ROOT;
        for chunk in prompt.chunks(bs).take(shareable) {
            let h = chain_hash(parent, chunk);
            match self.cached.get(&h) {
                Some(c) if c.parent == parent && c.tokens == chunk => {
                    s.blocks.push(c.block);
                    s.hashes.push(h);
                    s.tokens.extend_from_slice(chunk);
                    parent = h;
                }
                _ => break,
            }
        }
        let cached = s.tokens.len();
        s.written = cached;
        let needed = (prompt.len() - cached).div_ceil(bs);
        if needed > self.free.len() {
            return Err(KvBlockError::OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        for &b in &s.blocks {
            self.refs[b as usize] += 1;
        }
        self.seqs.insert(seq, s);
        let appended = self.append_rows(seq, &prompt[cached..], written)?;
        Ok((cached, appended))
    }

    /// Records that the first `upto` rows of `seq` are in its blocks (a prefill chunk ran):
    /// the full blocks among them become shareable. Fewer rows than already recorded change
    /// nothing.
    pub fn written(&mut self, seq: SeqId, upto: usize) -> Result<(), KvBlockError> {
        let mut s = self
            .seqs
            .remove(&seq)
            .ok_or(KvBlockError::UnknownSequence(seq))?;
        let len = s.tokens.len();
        if upto > len {
            self.seqs.insert(seq, s);
            return Err(KvBlockError::PastEnd { seq, upto, len });
        }
        s.written = s.written.max(upto);
        self.register_written(&mut s);
        self.seqs.insert(seq, s);
        Ok(())
    }

    /// A new sequence `child` holding all of `parent`'s blocks (the partial last one too) by
    /// reference; the first append to a shared partial block copies it.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvBlockError> {
        if self.seqs.contains_key(&child) {
            return Err(KvBlockError::SequenceExists(child));
        }
        let s = self
            .seqs
            .get(&parent)
            .ok_or(KvBlockError::UnknownSequence(parent))?
            .clone();
        for &b in &s.blocks {
            self.refs[b as usize] += 1;
        }
        self.seqs.insert(child, s);
        Ok(())
    }

    /// Appends `tokens` to `seq`: the slots their rows go to, new blocks taken as needed, and a
    /// copy-on-write of the last block when it is partial and shared. All or nothing. A
    /// sequence whose reserved prefill is not all written takes no append
    /// ([`KvBlockError::Unwritten`]): its rows would land after rows that are not there.
    pub fn append(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Appended, KvBlockError> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(KvBlockError::UnknownSequence(seq))?;
        if s.written < s.tokens.len() {
            return Err(KvBlockError::Unwritten(seq));
        }
        self.append_rows(seq, tokens, true)
    }

    /// [`BlockPool::append`] without the written check; `written`: the caller writes the rows
    /// at once (else [`BlockPool::written`] reports them later).
    fn append_rows(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        written: bool,
    ) -> Result<Appended, KvBlockError> {
        let bs = self.block_size;
        let s = self
            .seqs
            .get(&seq)
            .ok_or(KvBlockError::UnknownSequence(seq))?;
        let len = s.tokens.len();
        let used = len % bs;
        let last_shared = used != 0
            && !tokens.is_empty()
            && s.blocks.last().is_some_and(|&b| self.refs[b as usize] > 1);
        let room = if used == 0 { 0 } else { bs - used };
        let needed = tokens.len().saturating_sub(room).div_ceil(bs) + usize::from(last_shared);
        if needed > self.free.len() {
            return Err(KvBlockError::OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        let mut out = Appended::default();
        let mut s = self.seqs.remove(&seq).expect("looked up above");
        if last_shared {
            let from = s.blocks.pop().expect("a partial block exists");
            self.refs[from as usize] -= 1;
            let to = self.take();
            s.blocks.push(to);
            out.copy = Some(BlockCopy {
                from,
                to,
                rows: used,
            });
        }
        for &t in tokens {
            let pos = s.tokens.len();
            if pos.is_multiple_of(bs) {
                let b = self.take();
                s.blocks.push(b);
            }
            let block = s.blocks[pos / bs];
            out.slots.push((block as usize * bs + pos % bs) as i32);
            s.tokens.push(t);
        }
        if written {
            s.written = s.tokens.len();
            self.register_written(&mut s);
        }
        self.seqs.insert(seq, s);
        Ok(out)
    }

    /// Ends `seq`: each of its blocks loses a reference, and those no table holds are free.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvBlockError> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or(KvBlockError::UnknownSequence(seq))?;
        for b in s.blocks {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r == 0 {
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.cached.remove(&h);
                }
                self.free.push(b);
            }
        }
        Ok(())
    }

    fn take(&mut self) -> u32 {
        let b = self.free.pop().expect("counted before taking");
        self.refs[b as usize] = 1;
        b
    }

    /// Registers each full block of `s` whose rows are all written and that is not yet
    /// registered, in order, under its chain hash (unless a block already holds those tokens).
    fn register_written(&mut self, s: &mut Sequence) {
        let bs = self.block_size;
        while (s.hashes.len() + 1) * bs <= s.written {
            let i = s.hashes.len();
            let block = s.blocks[i];
            let parent = if i == 0 { ROOT } else { s.hashes[i - 1] };
            let tokens = &s.tokens[i * bs..(i + 1) * bs];
            let h = chain_hash(parent, tokens);
            s.hashes.push(h);
            if self.hash_of[block as usize].is_none() && !self.cached.contains_key(&h) {
                self.cached.insert(
                    h,
                    Cached {
                        block,
                        parent,
                        tokens: tokens.to_vec(),
                    },
                );
                self.hash_of[block as usize] = Some(h);
            }
        }
    }

    /// The pool's invariants, for tests: every block is free exactly when no table holds it,
    /// no block is free twice, each count is the number of table entries holding the block,
    /// and every cached block is held.
    pub fn check(&self) -> Result<(), String> {
        let mut held = vec![0u32; self.refs.len()];
        for s in self.seqs.values() {
            for &b in &s.blocks {
                held[b as usize] += 1;
            }
            if s.blocks.len() != s.tokens.len().div_ceil(self.block_size) {
                return Err(format!(
                    "{} blocks for {} tokens",
                    s.blocks.len(),
                    s.tokens.len()
                ));
            }
            if s.written > s.tokens.len() || s.hashes.len() != s.written / self.block_size {
                return Err(format!(
                    "{} of {} rows written, {} blocks registered",
                    s.written,
                    s.tokens.len(),
                    s.hashes.len()
                ));
            }
        }
        let mut free = vec![false; self.refs.len()];
        for &b in &self.free {
            if std::mem::replace(&mut free[b as usize], true) {
                return Err(format!("block {b} is free twice"));
            }
        }
        for (b, (&r, &h)) in self.refs.iter().zip(&held).enumerate() {
            if r != h {
                return Err(format!("block {b}: count {r}, held by {h} table entries"));
            }
            if free[b] != (r == 0) {
                return Err(format!("block {b}: count {r} but free = {}", free[b]));
            }
        }
        for c in self.cached.values() {
            if self.refs[c.block as usize] == 0 {
                return Err(format!("cached block {} is free", c.block));
            }
        }
        Ok(())
    }
}
