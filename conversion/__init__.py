"""hub_vit.conversion"""
