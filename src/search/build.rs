//! Building the index: every tool's four field texts, analysed into terms, with the BM25F
//! weight of each (term, tool) computed once, and per (term, domain) the bounds that let a
//! query skip domains that cannot make the cut.

use std::collections::HashMap;

use serde_json::Value;

use super::analysis::{self, Analyzer};
use super::{Bm25, DomainBound, FIELDS, SearchIndex, Surface, TermId};
use crate::registry::{DomainId, Registry};

/// One tool's analysed document: each (term, field) occurrence, sorted, and its length in
/// terms per field.
type Document = (Vec<(TermId, u8)>, [f32; FIELDS]);

/// The field that holds a tool's word pairs: each two informative words that follow each
/// other (stop words skipped) in one of the text fields.
const PAIRS: usize = 4;

/// The text of one tool's four fields.
pub(super) fn tool_fields(registry: &Registry, d: DomainId, t: usize) -> [String; 4] {
    let domain = registry.domain(d);
    let tool = &domain.tools[t];
    let mut schema = String::new();
    if let Ok(v) = serde_json::from_str::<Value>(&tool.input_schema_json) {
        walk_schema(&v, &mut schema);
    }
    let mut domain_text = domain.display_name.clone();
    // The default description says only "tools" and "group", which no request is about.
    if domain.description != crate::registry::manifest::default_description(&domain.name) {
        domain_text.push(' ');
        domain_text.push_str(&domain.description);
    }
    for k in &domain.keywords {
        domain_text.push(' ');
        domain_text.push_str(k);
    }
    [
        analysis::split_identifier(&tool.name),
        tool.description.clone(),
        schema,
        domain_text,
    ]
}

/// Appends the words of a JSON Schema: property names (split), descriptions, titles, enum
/// values, and the same for nested objects, items and combinators.
fn walk_schema(v: &Value, out: &mut String) {
    let Value::Object(map) = v else { return };
    for key in ["description", "title"] {
        if let Some(Value::String(s)) = map.get(key) {
            out.push(' ');
            out.push_str(s);
        }
    }
    if let Some(Value::Array(values)) = map.get("enum") {
        for e in values {
            if let Value::String(s) = e {
                out.push(' ');
                out.push_str(&analysis::split_identifier(s));
            }
        }
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, prop) in props {
            out.push(' ');
            out.push_str(&analysis::split_identifier(name));
            walk_schema(prop, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = map.get(key) {
            walk_schema(inner, out);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(items)) = map.get(key) {
            for inner in items {
                walk_schema(inner, out);
            }
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get(key) {
            for inner in defs.values() {
                walk_schema(inner, out);
            }
        }
    }
}

impl SearchIndex {
    /// Builds the index over every tool of `registry` (active or not: activation changes
    /// per settings snapshot, the index per registry).
    pub fn new(registry: &Registry) -> SearchIndex {
        SearchIndex::with_params(registry, &Bm25::default())
    }

    /// Builds the index with other BM25F parameters.
    pub(crate) fn with_params(registry: &Registry, params: &Bm25) -> SearchIndex {
        let fields = &params.fields;
        let k1 = params.k1;
        let analyzer = Analyzer::new();
        let mut terms: HashMap<String, TermId, _> = HashMap::default();
        let mut surface = Surface::default();
        let mut term_words: Vec<String> = Vec::new();
        let mut tool_domain = Vec::with_capacity(registry.tool_count());
        let mut domain_start = Vec::with_capacity(registry.domains().len() + 1);
        let mut names = Vec::with_capacity(registry.tool_count());
        // Per tool: (term, field) occurrences, and per field the tool's length in terms. Word
        // pairs get their terms once every word has one.
        let mut docs: Vec<Document> = Vec::with_capacity(registry.tool_count());
        let mut tool_pairs: Vec<Vec<(TermId, TermId)>> = Vec::with_capacity(registry.tool_count());

        for (d, domain) in registry.domains().iter().enumerate() {
            domain_start.push(tool_domain.len() as u32);
            for (t, tool) in domain.tools.iter().enumerate() {
                names.push((tool.name.to_lowercase(), tool_domain.len() as u32));
                tool_domain.push(d as u32);
                let texts = tool_fields(registry, DomainId::at(d), t);
                let mut occurrences = Vec::new();
                let mut pairs = Vec::new();
                let mut lengths = [0f32; FIELDS];
                for (f, text) in texts.iter().enumerate() {
                    let mut previous = None;
                    for w in analysis::words(text) {
                        let term = surface.get_or_insert_with(&w.text, || {
                            if analyzer.is_stop(&w.text) {
                                return None;
                            }
                            let stem = analyzer.stem(&w.text).into_owned();
                            let next = terms.len() as TermId;
                            let id = *terms.entry(stem).or_insert(next);
                            if id == next {
                                term_words.push(w.text.clone());
                            }
                            Some(id)
                        });
                        if let Some(term) = term {
                            occurrences.push((term, f as u8));
                            lengths[f] += 1.0;
                            if let Some(first) = previous.replace(term) {
                                pairs.push((first, term));
                            }
                        }
                    }
                }
                lengths[PAIRS] = pairs.len() as f32;
                occurrences.reserve_exact(pairs.len());
                docs.push((occurrences, lengths));
                tool_pairs.push(pairs);
            }
        }
        // Pair terms follow the word terms, numbered in order of first appearance.
        let words = terms.len() as TermId;
        let mut pair_terms: HashMap<(TermId, TermId), TermId, _> = HashMap::default();
        for ((occurrences, _), pairs) in docs.iter_mut().zip(tool_pairs) {
            for pair in pairs {
                let next = words + pair_terms.len() as TermId;
                occurrences.push((*pair_terms.entry(pair).or_insert(next), PAIRS as u8));
            }
            occurrences.sort_unstable();
        }
        let term_count = words as usize + pair_terms.len();
        domain_start.push(tool_domain.len() as u32);

        let n = docs.len().max(1) as f32;
        let mut avg = [0f32; FIELDS];
        for (_, lengths) in &docs {
            for f in 0..FIELDS {
                avg[f] += lengths[f] / n;
            }
        }
        // Posting lists, laid out at once: per term, how many tools hold it, then where its
        // list starts.
        let mut post_start = vec![0u32; term_count + 1];
        for (occurrences, _) in &docs {
            for (i, &(term, _)) in occurrences.iter().enumerate() {
                if i == 0 || occurrences[i - 1].0 != term {
                    post_start[term as usize + 1] += 1;
                }
            }
        }
        for t in 0..term_count {
            post_start[t + 1] += post_start[t];
        }
        // Per term: (tool, pseudo term frequency), in tool order; then, in place, the
        // term's BM25F weight in that tool.
        let mut post = vec![(0u32, 0f32); post_start[term_count] as usize];
        let mut next_slot = post_start.clone();
        for (tool, (occurrences, lengths)) in docs.iter().enumerate() {
            let norm: [f32; FIELDS] = std::array::from_fn(|f| {
                let rel = if avg[f] > 0.0 { lengths[f] / avg[f] } else { 0.0 };
                1.0 - fields[f].b + fields[f].b * rel
            });
            let mut i = 0;
            while i < occurrences.len() {
                let term = occurrences[i].0;
                let mut tf = 0.0;
                while i < occurrences.len() && occurrences[i].0 == term {
                    let f = usize::from(occurrences[i].1);
                    tf += fields[f].weight / norm[f];
                    i += 1;
                }
                let slot = &mut next_slot[term as usize];
                post[*slot as usize] = (tool as u32, tf);
                *slot += 1;
            }
        }
        drop((docs, next_slot));
        let domains = registry.domains().len().max(1) as f32;
        let idf = |n: f32, df: f32| (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
        // Per term, the (term, domain) pieces its list is cut into below.
        let mut pieces = 0;
        for term in 0..term_count {
            let list = &mut post[post_start[term] as usize..post_start[term + 1] as usize];
            // Over tools and over domains: a term that many tools of one domain share
            // ("patient") tells the domain apart as well as a rare one.
            let in_domains = 1 + list
                .windows(2)
                .filter(|w| tool_domain[w[0].0 as usize] != tool_domain[w[1].0 as usize])
                .count();
            pieces += in_domains;
            let idf = idf(n, list.len() as f32).powf(1.0 - params.domain_idf)
                * idf(domains, in_domains as f32).powf(params.domain_idf);
            for (_, w) in list {
                let tf = *w;
                *w = idf * tf * (k1 + 1.0) / (tf + k1);
            }
        }
        // Each term's postings, in tool order, cut where the domain changes: the pieces follow
        // each other in `post`, so each ends where the next begins.
        let mut dom_post_start = Vec::with_capacity(term_count + 1);
        let mut dom_post: Vec<DomainBound> = Vec::with_capacity(pieces);
        let mut dom_tools = Vec::with_capacity(pieces + 1);
        for term in 0..term_count {
            let first = dom_post.len();
            dom_post_start.push(first as u32);
            for i in post_start[term]..post_start[term + 1] {
                let (tool, w) = post[i as usize];
                let domain = tool_domain[tool as usize];
                match dom_post[first..].last_mut() {
                    Some(p) if p.domain == domain => p.max = p.max.max(w),
                    _ => {
                        dom_post.push(DomainBound { domain, max: w });
                        dom_tools.push(i);
                    }
                }
            }
        }
        dom_post_start.push(dom_post.len() as u32);
        dom_tools.push(post.len() as u32);
        let max_domain_tools = domain_start
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        SearchIndex {
            analyzer,
            terms,
            surface,
            pair_terms,
            term_words,
            post_start,
            post,
            dom_post_start,
            dom_post,
            dom_tools,
            max_domain_tools,
            tool_domain,
            domain_start,
            names: {
                names.sort_unstable();
                names
            },
            id: super::INDEXES_BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}
