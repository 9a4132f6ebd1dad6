"""Command-line programs built on the library; the library never imports them."""
