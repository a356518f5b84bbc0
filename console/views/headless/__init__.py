"""The headless view: prefixed rank output, the closing summary, event recordings."""
