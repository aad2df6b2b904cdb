//! What OpenAI's list routes share (`GET /v1/responses/{id}/input_items`, `GET /v1/files`,
//! `GET /v1/batches`): the query's `limit`, `order` and `after`, and the list object
//! `{"object": "list", "data", "first_id", "last_id", "has_more"}`.

use crate::error::ApiError;
use axum::http::Uri;
use serde_json::{Value, json};

/// The `key=value` pairs of a query string, percent-decoded (`include=core%2Cqueues` is
/// `core,queues`; bytes that are not UTF-8 become U+FFFD).
pub(crate) fn query_pairs(uri: &Uri) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_str(uri.query().unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("the query string cannot be read: {e}")))
}

/// Which page of a list a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Page {
    /// Most items.
    pub limit: usize,
    /// Oldest first (else newest first, OpenAI's default).
    pub ascending: bool,
    /// Only items after the one with this id.
    pub after: Option<String>,
}

impl Page {
    /// Read `limit` (1 to `max`, default `default`), `order` (`asc` or `desc`, default `desc`
    /// unless `ascending`) and `after`; `other` takes the route's own keys (true when it knew
    /// one), and any key left is a 400 naming it and `known`, the route's keys.
    pub(crate) fn from_query(
        uri: &Uri,
        (default, max): (usize, usize),
        ascending: bool,
        known: &str,
        mut other: impl FnMut(&str, &str) -> Result<bool, ApiError>,
    ) -> Result<Self, ApiError> {
        let mut page = Page {
            limit: default,
            ascending,
            after: None,
        };
        for (key, value) in query_pairs(uri)? {
            let (key, value) = (key.as_str(), value.as_str());
            match key {
                "limit" => {
                    page.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=max).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_param(
                                "limit",
                                format!("limit must be 1 to {max}, not {value:?}"),
                            )
                        })?;
                }
                "order" => {
                    page.ascending = match value {
                        "asc" => true,
                        "desc" => false,
                        other => {
                            return Err(ApiError::bad_param(
                                "order",
                                format!("order must be asc or desc, not {other:?}"),
                            ));
                        }
                    };
                }
                "after" => page.after = Some(value.to_string()),
                k if other(k, value)? => {}
                k => {
                    return Err(ApiError::bad_param(
                        k,
                        format!("unknown query parameter {k:?}; use {known}"),
                    ));
                }
            }
        }
        Ok(page)
    }

    /// The list object of this page of `items` (oldest first), each shown as `object(item)`
    /// with its id at `"id"`; an `after` that is not among them is a 400 naming `after` with
    /// `missing`, what to call it.
    pub(crate) fn list<T>(
        &self,
        items: &[T],
        object: impl Fn(&T) -> Value,
        missing: impl FnOnce(&str) -> String,
    ) -> Result<Value, ApiError> {
        let mut all: Vec<Value> = items.iter().map(object).collect();
        if !self.ascending {
            all.reverse();
        }
        let start = match &self.after {
            None => 0,
            Some(a) => {
                all.iter()
                    .position(|i| i["id"] == a.as_str())
                    .ok_or_else(|| ApiError::bad_param("after", missing(a)))?
                    + 1
            }
        };
        let page: Vec<Value> = all.iter().skip(start).take(self.limit).cloned().collect();
        Ok(json!({
            "object": "list",
            "first_id": page.first().map(|i| i["id"].clone()),
            "last_id": page.last().map(|i| i["id"].clone()),
            "has_more": start + page.len() < all.len(),
            "data": page,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(q: &str) -> Uri {
        format!("/x?{q}").parse().unwrap()
    }

    #[test]
    fn queries_pick_a_page_and_refuse_what_they_do_not_know() {
        let none = |_: &str, _: &str| Ok(false);
        let p = Page::from_query(
            &uri("limit=2&order=asc&after=b"),
            (20, 100),
            false,
            "",
            none,
        )
        .unwrap();
        assert_eq!(
            p,
            Page {
                limit: 2,
                ascending: true,
                after: Some("b".into())
            }
        );
        for (q, param) in [
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("order=up", "order"),
        ] {
            let e = Page::from_query(&uri(q), (20, 100), false, "", none).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{q}");
        }
        let e = Page::from_query(
            &uri("colour=red"),
            (20, 100),
            false,
            "limit and after",
            none,
        )
        .unwrap_err();
        assert!(e.message.contains("use limit and after"), "{}", e.message);
        let mut purpose = None;
        Page::from_query(&uri("purpose=batch"), (20, 100), false, "", |k, v| {
            purpose = Some(v.to_string());
            Ok(k == "purpose")
        })
        .unwrap();
        assert_eq!(purpose.as_deref(), Some("batch"));
        // Percent-encoded keys and values are decoded.
        let p = Page::from_query(&uri("%61fter=file%2Dx+y"), (20, 100), false, "", none).unwrap();
        assert_eq!(p.after.as_deref(), Some("file-x y"));
    }

    #[test]
    fn lists_page_newest_first_after_an_id() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
        let page = |q: &str| {
            Page::from_query(&uri(q), (2, 10), false, "", |_, _| Ok(false))
                .unwrap()
                .list(&items, Value::clone, |a| format!("no {a}"))
        };
        let l = page("").unwrap();
        assert_eq!(l["data"], json!([{"id": "i4"}, {"id": "i3"}]));
        assert_eq!(
            (&l["first_id"], &l["last_id"], &l["has_more"]),
            (&json!("i4"), &json!("i3"), &json!(true))
        );
        let l = page("after=i1").unwrap();
        assert_eq!(l["data"], json!([{"id": "i0"}]));
        assert_eq!(l["has_more"], false);
        let l = page("order=asc&limit=10").unwrap();
        assert_eq!(l["data"].as_array().unwrap().len(), 5);
        assert_eq!(
            page("after=zz").unwrap_err().param.as_deref(),
            Some("after")
        );
    }
}
