"""Marketplace clients behind one interface (`base.Provider`): vast.ai (`vast`) and RunPod (`runpod`), the plain
records they return (`records`), their errors (`errors`); `registry.get_provider` builds one from the settings.
Importing a submodule loads only what it needs: `records` is plain Python, so the pure ranking can use it."""
