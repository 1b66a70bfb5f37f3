"""Acceptance measurement, reports and production monitoring."""
