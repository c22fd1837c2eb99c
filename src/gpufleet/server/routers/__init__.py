"""One thin router per resource: parse, authorise (via the ``Me`` dependency), call one
service function, return a schema."""
