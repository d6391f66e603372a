"""hub_vit.export"""
