"""What a recorded run is: models, canonical JSON, fingerprints, redaction, policies, bundle IO."""
