"""The HTTP API: ``core.api.app.create_app`` builds the app; routes over the serving layer."""
