"""Presentation: the text explanation, plan graph (DOT/SVG), memory timeline, notebook HTML."""
