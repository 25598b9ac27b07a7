//! Configuration model, validation and the registry of live objects.
