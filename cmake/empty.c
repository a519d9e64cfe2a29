/* placeholder so an empty module still builds */ typedef int df_empty_translation_unit;
