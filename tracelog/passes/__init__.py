"""Rewrites of IR graphs before emission."""
