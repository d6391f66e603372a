"""hub_vit.explain"""
