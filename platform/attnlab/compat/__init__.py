"""The one place that touches other libraries' private API (Lightning, sacreBLEU), each name behind a version guard."""
