/* The model profile's built-in calibration prompts (model_profile.h): short
 * texts of many kinds, so the neurons that fire on any one kind do not pass
 * for the model's hot set. Disjoint from the predictor's calibration and
 * evaluation prompts (predictor_build.h). */
#include "calib/model_profile.h"

const char *const model_profile_builtin_prompts[] = {
    /* stories */
    "The old lighthouse keeper climbed the stairs every evening, even after the ships stopped coming.",
    "When the snow finally melted, the children found a bicycle that had been buried since December. "
    "Nobody in the village knew whose it was.",
    "Mara packed a lantern, a map and three apples, and set off before the sun rose over the hills.",
    /* instructions */
    "Unplug the printer, wait ten seconds, and plug it back in. If the light still blinks red, call support.",
    "Before you submit the form, check that your name matches the one on your passport.",
    /* a recipe */
    "Whisk two eggs with a cup of milk, pour the mixture over the bread, and bake it for thirty minutes "
    "until golden.",
    /* code */
    "int max(int a, int b) {\n    return a > b ? a : b;\n}",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "for line in open('data.txt'):\n    words = line.split()\n    print(len(words))",
    /* lists */
    "Shopping list: bread, butter, tomatoes, rice, coffee, and a bag of oranges.",
    "The three primary colors are red, yellow and blue; mixing them gives orange, green and purple.",
    /* dialogue */
    "\"Are you coming to the concert tonight?\" asked Tom. \"Only if it stops raining,\" said Anna.",
    "Customer: My order has not arrived yet. Agent: I am sorry to hear that, let me check the tracking number.",
    /* facts */
    "The Pacific Ocean is the largest and deepest of the Earth's oceans.",
    "Honey never spoils: jars of it found in ancient Egyptian tombs were still edible.",
    "The human heart beats about one hundred thousand times a day.",
    "Mount Everest rises almost nine thousand meters above sea level, on the border of Nepal and China.",
    /* poetry */
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.",
    "The fog comes on little cat feet. It sits looking over harbor and city, and then moves on.",
    /* news, letters, opinions, questions */
    "Local officials announced on Tuesday that the bridge will reopen to traffic next spring.",
    "Dear Professor Lee, I am writing to ask whether the seminar on Thursday will be held online.",
    "In my opinion, the second film was better than the first, mostly because of its music.",
    "Why does the moon look larger when it is close to the horizon?",
    /* arithmetic */
    "If a train leaves at 9:15 and the journey takes 2 hours and 50 minutes, it arrives at 12:05.",
};
const int model_profile_n_builtin = sizeof model_profile_builtin_prompts / sizeof model_profile_builtin_prompts[0];
