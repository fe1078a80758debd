"""Analysis: the metrics of DESIGN §9, tables and figures, all rebuilt from the store's views."""
