"""hub_vit.server"""
