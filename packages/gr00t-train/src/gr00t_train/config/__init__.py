"""The training configuration: the settings' dataclasses (`sections`), typed coercion (`types`), files and overrides
(`io`), the printed template's docs (`docs`), named runs (`presets`) and the speed switches (`optimizations`)."""
