"""The one place that touches other libraries' private API (Lightning, sacreBLEU, torch), each name behind a version guard."""
