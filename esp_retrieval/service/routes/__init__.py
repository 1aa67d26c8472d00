"""HTTP routes, one module per concern; :func:`service.app.create_app` includes their routers."""
