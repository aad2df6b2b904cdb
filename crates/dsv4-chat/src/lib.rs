//! dsv4 tokenizer (HF tokenizer.json) and DSV4 chat markers.
