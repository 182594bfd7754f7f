"""Tools for verl's `tool_agent` agent loop."""
