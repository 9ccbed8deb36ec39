"""Command-line interface: a thin typer layer over the library (the library never imports it)."""
