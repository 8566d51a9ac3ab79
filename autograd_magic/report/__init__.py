"""The report: what a trace's analysis means, in words and tables, ready for any renderer.

`build_report(analysis, options)` makes one `Report`; all English lives in this package.
"""
