//! A request's trace context across tiers (W3C `traceparent`), for the
//! OTLP traces a process exports when it is configured to
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`; docs/deployment.md): the global tier
//! sends its request span's context with each call to a region, which
//! makes it the parent of its own request span. In a process that exports
//! nothing both are no-ops (no propagator is set).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Makes the context `headers` carry (a caller's span) `span`'s parent.
pub fn adopt_parent(span: &tracing::Span, headers: &HeaderMap) {
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    let _ = span.set_parent(cx);
}

/// The current span's context as headers for a call to another tier
/// (none where nothing is exported).
pub fn context_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeadersMut(&mut headers))
    });
    headers
}
