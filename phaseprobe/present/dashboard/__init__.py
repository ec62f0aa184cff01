"""The Streamlit dashboard (``phaseprobe dashboard``): one script, one small module per page.

Only this package (and ``cmd_dashboard``) imports streamlit; the pages read the store through
:mod:`.data` and call the pure analyses, so every number shown is one the CLI can print too.
"""
