"""The one place that touches private torch / Lightning API, each symbol behind a version guard."""
