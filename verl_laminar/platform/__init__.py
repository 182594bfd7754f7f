"""Device platforms verl lacks (CPU) and the install-time glue they need."""
