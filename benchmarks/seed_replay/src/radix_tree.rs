//! Ours, not the seed's: kapsl-llm's kv_cache.rs uses `crate::radix_tree::RadixTree`, which was
//! not given with it. This is a compressed radix tree (token runs on the edges) written from the
//! seed's calls alone:
//!   - `RadixTree::new()`;
//!   - `insert(tokens, block)`: the seed inserts the whole token prefix that ends a full block,
//!     keyed to that block's id;
//!   - `remove(tokens)`: forgets the value stored for exactly that prefix;
//!   - `match_prefix(tokens) -> (blocks, matched_len)`: the values met along the longest stored
//!     path that `tokens` starts with, in path order (one per full block, since the seed stores
//!     one value per block boundary), and the token count up to the last of them.
//! A split node mid-block carries no value and is passed over. Nodes live in an arena with a
//! free list, so a node is one allocation for its edge and one for its children map.

use std::collections::HashMap;

struct Node {
    /// Tokens on the edge from the parent to this node.
    edge: Vec<u64>,
    /// Children by the first token of their edge.
    children: HashMap<u64, usize>,
    value: Option<usize>,
    parent: usize,
}

pub struct RadixTree {
    nodes: Vec<Node>,
    free: Vec<usize>,
}

const ROOT: usize = 0;

impl Default for RadixTree {
    fn default() -> Self {
        Self::new()
    }
}

impl RadixTree {
    pub fn new() -> Self {
        Self {
            nodes: vec![Node {
                edge: Vec::new(),
                children: HashMap::new(),
                value: None,
                parent: ROOT,
            }],
            free: Vec::new(),
        }
    }

    fn new_node(&mut self, edge: Vec<u64>, parent: usize) -> usize {
        let node = Node {
            edge,
            children: HashMap::new(),
            value: None,
            parent,
        };
        if let Some(i) = self.free.pop() {
            self.nodes[i] = node;
            i
        } else {
            self.nodes.push(node);
            self.nodes.len() - 1
        }
    }

    /// Stores `value` for the prefix `key` (replacing an older one).
    pub fn insert(&mut self, key: &[u64], value: usize) {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let child = match self.nodes[node].children.get(&key[pos]) {
                Some(&c) => c,
                None => {
                    let leaf = self.new_node(key[pos..].to_vec(), node);
                    self.nodes[node].children.insert(key[pos], leaf);
                    self.nodes[leaf].value = Some(value);
                    return;
                }
            };
            let edge = &self.nodes[child].edge;
            let common = edge
                .iter()
                .zip(&key[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            if common == edge.len() {
                node = child;
                pos += common;
                continue;
            }
            // Split the child's edge at `common`: a new middle node takes the shared part.
            let tail = self.nodes[child].edge.split_off(common);
            let head = std::mem::replace(&mut self.nodes[child].edge, tail);
            let mid = self.new_node(head, node);
            self.nodes[node].children.insert(key[pos], mid);
            let child_first = self.nodes[child].edge[0];
            self.nodes[mid].children.insert(child_first, child);
            self.nodes[child].parent = mid;
            node = mid;
            pos += common;
        }
        self.nodes[node].value = Some(value);
    }

    /// The node whose path is exactly `key`.
    fn find(&self, key: &[u64]) -> Option<usize> {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let child = *self.nodes[node].children.get(&key[pos])?;
            let edge = &self.nodes[child].edge;
            if key.len() - pos < edge.len() || edge[..] != key[pos..pos + edge.len()] {
                return None;
            }
            pos += edge.len();
            node = child;
        }
        Some(node)
    }

    /// Forgets the value stored for exactly `key`, pruning nodes left without a purpose.
    pub fn remove(&mut self, key: &[u64]) {
        let Some(mut node) = self.find(key) else {
            return;
        };
        self.nodes[node].value = None;
        // A valueless leaf goes; a valueless node left with one child merges into it.
        while node != ROOT && self.nodes[node].value.is_none() {
            let parent = self.nodes[node].parent;
            match self.nodes[node].children.len() {
                0 => {
                    let first = self.nodes[node].edge[0];
                    self.nodes[parent].children.remove(&first);
                    self.release(node);
                    node = parent;
                }
                1 => {
                    let (_, &only) = self.nodes[node].children.iter().next().unwrap();
                    let mut edge = std::mem::take(&mut self.nodes[node].edge);
                    edge.extend_from_slice(&self.nodes[only].edge);
                    let first = edge[0];
                    self.nodes[only].edge = edge;
                    self.nodes[only].parent = parent;
                    self.nodes[parent].children.insert(first, only);
                    self.release(node);
                    break;
                }
                _ => break,
            }
        }
    }

    fn release(&mut self, node: usize) {
        self.nodes[node].children = HashMap::new();
        self.nodes[node].edge = Vec::new();
        self.nodes[node].value = None;
        self.free.push(node);
    }

    /// The values along the longest stored path that `key` starts with, and the tokens up to
    /// the last of them.
    pub fn match_prefix(&self, key: &[u64]) -> (Vec<usize>, usize) {
        let mut values = Vec::new();
        let mut matched = 0;
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(&child) = self.nodes[node].children.get(&key[pos]) else {
                break;
            };
            let edge = &self.nodes[child].edge;
            if key.len() - pos < edge.len() || edge[..] != key[pos..pos + edge.len()] {
                break;
            }
            pos += edge.len();
            node = child;
            if let Some(v) = self.nodes[node].value {
                values.push(v);
                matched = pos;
            }
        }
        (values, matched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_block_prefixes_in_order() {
        let mut t = RadixTree::new();
        let toks: Vec<u64> = (0..48).collect();
        t.insert(&toks[..16], 7);
        t.insert(&toks[..32], 8);
        t.insert(&toks[..48], 9);
        let mut other = toks[..32].to_vec();
        other.extend(100..116);
        t.insert(&other, 3);
        assert_eq!(t.match_prefix(&toks), (vec![7, 8, 9], 48));
        assert_eq!(t.match_prefix(&other), (vec![7, 8, 3], 48));
        assert_eq!(t.match_prefix(&toks[..40]), (vec![7, 8], 32));
        t.remove(&toks[..48]);
        assert_eq!(t.match_prefix(&toks), (vec![7, 8], 32));
        assert_eq!(t.match_prefix(&other), (vec![7, 8, 3], 48));
        t.remove(&other);
        t.remove(&toks[..32]);
        t.remove(&toks[..16]);
        assert_eq!(t.match_prefix(&toks), (vec![], 0));
        assert!(t.nodes[ROOT].children.is_empty());
    }
}
