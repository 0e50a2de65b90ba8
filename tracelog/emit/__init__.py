"""Emitters: IR -> programs and models for other frameworks."""
