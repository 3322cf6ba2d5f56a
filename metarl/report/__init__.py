"""Reporting: the HTML run report (html), its tables and CSVs (tables), and the terminal rendering of status and
progress (terminal)."""
