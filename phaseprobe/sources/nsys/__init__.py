"""Nsight Systems: SQLite exports (streamed), `nsys stats` CSV and console text, and what
each read accounted for."""
