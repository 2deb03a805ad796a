"""YAML specs (models, hardware) into frozen, validated dataclasses."""
