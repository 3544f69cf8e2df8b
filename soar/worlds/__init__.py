"""Embedded worlds: small, download-free settings that run the same code path as the paper's."""
