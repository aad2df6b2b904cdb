//! dsv4 profiles: schema, figment layering, provenance, validation.
