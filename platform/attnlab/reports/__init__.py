"""Reports: many finished runs read back into tables, statistics, plots and published pages."""
